"""The memory limit of a trial on an accelerator: watched from the parent, not set on the child. A CPU trial's child
sets RLIMIT_AS on itself (autotune/trial/child.py), but address space is not memory on an accelerator: at start-up
the CUDA driver maps a unified virtual address range and device memory into the process (tens to hundreds of GiB
of address space it never touches on the host), so any limit sized for the trial's memory stops CUDA from starting;
torch_npu reserves likewise. So the parent samples the resident memory of the trial's process group (the child and
the compile workers it starts) and kills the group once it passes the limit."""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

__all__ = ["group_rss_bytes", "MemoryWatch"]

_PAGE = os.sysconf("SC_PAGE_SIZE")


def group_rss_bytes(pgid: int, proc: Path = Path("/proc")) -> int:
    """Resident bytes of every process in process group `pgid` (Linux /proc/PID/stat: pgrp and rss fields)."""
    total = 0
    for stat in proc.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended while we looked
            continue
        # "pid (comm) state ppid pgrp ... rss ...": comm may hold spaces and parentheses, so split after its last ")"
        fields = text[text.rfind(")") + 2:].split()
        if len(fields) > 21 and int(fields[2]) == pgid:
            total += int(fields[21]) * _PAGE
    return total


class MemoryWatch:
    """Samples a process group's resident memory every `interval_s` while started; past `limit_mb` it kills the
    group (SIGKILL) and keeps the figure in `exceeded_mb`."""

    def __init__(self, pgid: int, limit_mb: float, interval_s: float = 0.25) -> None:
        self.pgid, self.limit_mb, self.interval_s = pgid, limit_mb, interval_s
        self.exceeded_mb: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> MemoryWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            used_mb = group_rss_bytes(self.pgid) / 2**20
            if used_mb > self.limit_mb:
                self.exceeded_mb = used_mb
                try:
                    os.killpg(self.pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                return
