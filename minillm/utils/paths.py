"""Where minillm keeps what it builds once: the converted embedded model, compiled CPU kernels."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$MINILLM_CACHE, else ~/.cache/minillm."""
    return Path(os.environ.get("MINILLM_CACHE", Path.home() / ".cache" / "minillm"))
