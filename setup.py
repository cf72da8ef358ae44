"""Package discovery: `schedules/`, `targets/` and `tuning_logs/` live at the top level of the repo but
install as `opcompiler.schedules`, `opcompiler.targets` and `opcompiler.tuning_logs` (metadata is in pyproject.toml)."""
from setuptools import find_packages, setup

packages = find_packages(include=["opcompiler", "opcompiler.*"])
packages += ["opcompiler.schedules"] + [f"opcompiler.schedules.{p}" for p in find_packages("schedules")]
packages += ["opcompiler.targets", "opcompiler.tuning_logs"]

setup(packages=packages)
