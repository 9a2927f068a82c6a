"""What a benchmark reads of the device it runs on: where inputs go, a wait for queued work before each clock read,
and the peak memory of the runs. HostMeter is this process on the CPU; an accelerator's Device
(autotune/devices/base.py) reads its allocator instead, and the CPU's Device is a HostMeter."""
from __future__ import annotations

import gc
from typing import Protocol

from autotune.benchmark.peak_rss import peak_rss_bytes, reset_peak, trim_heap
from autotune.progress import log

__all__ = ["Meter", "HostMeter", "HOST", "PEAK_NOT_RESET"]

# Where the kernel refuses /proc/PID/clear_refs (some containers), the process's high-water mark cannot be brought
# down to the present: the peak then also holds loading the weights, building and the gate, and says so.
PEAK_NOT_RESET = ("the memory high-water mark could not be reset before the runs (/proc/PID/clear_refs refused): "
                  "this peak includes loading, building and gating, not only the runs")


class Meter(Protocol):
    torch_device: str

    def synchronize(self) -> None: ...

    def start_peak(self) -> bool:
        """Bring the high-water mark down to the present; False where it could not be."""

    def peak_since(self, base_rss: int) -> int:
        """Bytes at most in use since start_peak(): of the runs, with `base_rss` (the process before any weights
        were loaded) taken off where the figure is the process's."""


class HostMeter:
    """The CPU: kernels return when done, and memory is the process's RSS high-water mark
    (autotune/benchmark/peak_rss.py): weights, KV cache, activations and compiled code, as the OS saw them."""

    torch_device = "cpu"

    def synchronize(self) -> None:
        return None

    def start_peak(self) -> bool:
        gc.collect()
        trim_heap()  # memory already freed is not the runs' memory
        if reset_peak():
            return True
        log(f"  peak memory: {PEAK_NOT_RESET}")
        return False

    def peak_since(self, base_rss: int) -> int:
        return peak_rss_bytes() - base_rss


HOST = HostMeter()
