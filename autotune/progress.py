"""Progress lines on stderr, so stdout stays for results."""
from __future__ import annotations

import sys
import time

__all__ = ["log"]

_START = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - _START:7.1f}s] {message}", file=sys.stderr, flush=True)
