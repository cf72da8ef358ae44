"""Target description files (`*.toml`), shipped as package data `opcompiler.targets`."""
