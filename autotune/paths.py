"""Where autotune keeps what it computes once and reuses: converted weights, references, gate figures, compiled
kernels, measured peaks. One root, so that `AUTOTUNE_CACHE=$(mktemp -d)` gives a cold start."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    return Path(os.environ.get("AUTOTUNE_CACHE", Path.home() / ".cache" / "autotune"))
