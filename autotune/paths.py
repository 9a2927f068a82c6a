"""Where autotune keeps what it computes once and reuses: converted weights, references, gate figures, compiled
kernels, measured peaks. One root, so that `AUTOTUNE_CACHE=$(mktemp -d)` gives a cold start."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["cache_root", "write_atomic"]


def cache_root() -> Path:
    return Path(os.environ.get("AUTOTUNE_CACHE", Path.home() / ".cache" / "autotune"))


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` whole: a concurrent reader sees the old content or the new, never half of one."""
    fd, tmp = tempfile.mkstemp(prefix=path.name, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
