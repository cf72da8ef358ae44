"""Package discovery. `schedules/`, `targets/` and `tuning_logs/` live at the top level of the repo
and appear inside the package as symlinks (`opcompiler/schedules` -> `../schedules`, ...), so they
install as `opcompiler.schedules`, `opcompiler.targets` and `opcompiler.tuning_logs` and the source
tree imports exactly like the wheel. Metadata is in pyproject.toml."""
from setuptools import find_packages, setup

packages = find_packages(include=["opcompiler", "opcompiler.*"])
packages += ["opcompiler.schedules"] + [f"opcompiler.schedules.{p}" for p in find_packages("schedules")]
packages += ["opcompiler.targets", "opcompiler.tuning_logs"]

setup(packages=sorted(set(packages)))
