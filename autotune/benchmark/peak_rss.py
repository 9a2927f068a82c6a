"""Measured process memory on Linux: resident set size and its high-water mark, which can be reset."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["rss_bytes", "peak_rss_bytes", "reset_peak"]


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def rss_bytes() -> int:
    return _status_kb("VmRSS")


def peak_rss_bytes() -> int:
    return _status_kb("VmHWM")


def reset_peak() -> bool:
    """Reset the high-water mark to the current RSS (Linux 4.0+: write 5 to clear_refs). False where refused."""
    try:
        with open(f"/proc/{os.getpid()}/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False
