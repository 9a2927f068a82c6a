"""This machine's CPU: real builds and real measurements, each trial in its own process."""
from __future__ import annotations

import os
import platform
from pathlib import Path

from autotune.backends.base import Backend
from autotune.backends.isolated import run_isolated
from autotune.space import SearchSpace
from autotune.trial import Job

__all__ = ["CpuBackend"]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class CpuBackend(Backend):
    name = "cpu"

    def unavailable(self) -> str | None:
        return None

    def adapt_space(self, space: SearchSpace) -> SearchSpace:
        names = {d.name for d in space.dimensions}
        if "device_power" in names:
            cores = _cores()
            keep = tuple(v for v in space.dimension("device_power").values if v <= cores)
            if keep != space.dimension("device_power").values:
                space = space.restrict("device_power", keep or (cores,),
                                       f"device_power is the thread count on the CPU and this machine has {cores} cores")
        return space

    def run(self, job: Job, timeout_s: float) -> dict:
        return run_isolated(job, timeout_s)

    def fingerprint(self) -> dict:
        import torch

        model = _cpu_model()
        cores = _cores()
        isa = torch.backends.cpu.get_cpu_capability()
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        slug = "-".join(w for w in model.lower().replace("(r)", "").replace("(tm)", "").split()[:3] if w.isalnum())
        return {
            "hardware": f"cpu-{slug or 'unknown'}-{cores}c",
            "cpu": model, "cores": cores, "isa": isa, "memory_gib": round(mem_gib, 1),
            "machine": platform.machine(), "os": platform.platform(terse=True),
        }
