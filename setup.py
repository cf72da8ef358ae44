"""Package discovery: `schedules/` and `targets/` live at the top level of the repo but
install as `opcompiler.schedules` and `opcompiler.targets` (metadata is in pyproject.toml)."""
from setuptools import find_packages, setup

packages = find_packages(include=["opcompiler", "opcompiler.*"])
packages += ["opcompiler.schedules"] + [f"opcompiler.schedules.{p}" for p in find_packages("schedules")]
packages += ["opcompiler.targets"]

setup(packages=packages)
