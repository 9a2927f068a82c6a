"""Facts about this machine's CPU: its model, the cores this process may use, and the fingerprint that names its
hardware class (recipes are kept per class)."""
from __future__ import annotations

import os
import platform
from pathlib import Path

__all__ = ["cpu_model", "num_cores", "cpu_fingerprint"]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def num_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_fingerprint() -> dict:
    model = cpu_model()
    cores = num_cores()
    import torch  # here, not at the top: choosing a backend must not load torch

    isa = torch.backends.cpu.get_cpu_capability()
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    slug = "-".join(w for w in model.lower().replace("(r)", "").replace("(tm)", "").split()[:3] if w.isalnum())
    return {
        "hardware": f"cpu-{slug or 'unknown'}-{cores}c",
        "cpu": model, "cores": cores, "isa": isa, "memory_gib": round(mem_gib, 1),
        "machine": platform.machine(), "os": platform.platform(terse=True),
    }
