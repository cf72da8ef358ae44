"""Schedule templates, one folder per target family, installed as `opcompiler.schedules`.

Every family is imported here explicitly, so the registry is complete whatever the user
imported first (no import side effects to know about).
"""
from importlib import import_module

for _family in ("cpu", "ascend", "dsp", "cuda"):
    try:
        import_module(f"{__name__}.{_family}")
    except ModuleNotFoundError as e:  # a family not written yet
        if e.name != f"{__name__}.{_family}":
            raise
