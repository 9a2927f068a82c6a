"""Measured process memory on Linux: resident set size and its high-water mark, which can be reset."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

__all__ = ["rss_bytes", "peak_rss_bytes", "reset_peak", "trim_heap"]


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


def trim_heap() -> bool:
    """Hand the C heap's free pages back to the OS (glibc's malloc_trim). Tensors freed by Python (the fp32 model a
    build converted, compile temporaries) below glibc's mmap threshold, which grows to 32 MB as large blocks are
    freed, go back to the heap, not to the OS: without this they stay in RSS, and in every peak measured after.
    False where there is no glibc."""
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False
