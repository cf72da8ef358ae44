"""Shipped, verified tuning records (`<target>/<op>.jsonl`), installed as `opcompiler.tuning_logs`."""
