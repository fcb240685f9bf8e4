"""Where ort_zero keeps what it compiles for this machine (ORTModule's extensions, its tracer callback), so that a
fresh venv reuses it: `ORT_ZERO_CACHE`, else ~/.cache/ort_zero."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("ORT_ZERO_CACHE", Path.home() / ".cache" / "ort_zero"))
