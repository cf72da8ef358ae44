"""Where the seeds' published figures live: `../shared/calibration/published.json` beside the
repository (OPC_PUBLISHED overrides). Calibration tests read them rather than copy them."""
from __future__ import annotations

import os
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
PUBLISHED = Path(os.environ.get("OPC_PUBLISHED", _REPO.parent / "shared" / "calibration" / "published.json"))
if not PUBLISHED.is_file() and Path("/work/shared/calibration/published.json").is_file():
    PUBLISHED = Path("/work/shared/calibration/published.json")
