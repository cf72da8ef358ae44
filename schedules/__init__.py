"""Schedule templates, one folder per target family, installed as `opcompiler.schedules`.

Every family is imported here by name, so the registry is complete whatever the user
imported first (no import side effects to know about), and the import graph shows it.
"""
from . import ascend, cpu, cuda, dsp  # noqa: F401
