"""Test-wide set-up: the repository root on sys.path, so `tests.calibration` (and the fakes
other tests share) import the same way whichever directory pytest starts from."""
import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
