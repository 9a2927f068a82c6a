"""Peaks of this machine's CPU, measured (not looked up): a matmul per precision, an int8 matmul and a memory copy per
thread count, cached under the autotune cache so that a profile load costs nothing after the first time. Which
precisions the profile offers, and how slow each quantized kernel is against its precision's plain matmul, come
from the capability probe (autotune/probe/cpu.py), so that a bf16 trial on an AVX2-only CPU is predicted as the
emulated matmul it is."""
from __future__ import annotations

import json
import os
import time
from functools import partial
from pathlib import Path

from autotune.config.deploy import DTYPES, TORCH_DTYPE_NAMES
from autotune.contention import measured_quietly
from autotune.host import cpu_fingerprint, num_cores
from autotune.paths import cache_root
from autotune.probe.cpu import cpu_capabilities, probe_cache_path

__all__ = ["measured_peaks", "peaks_cache_path"]

# A matmul of this many seconds per run is long enough to time; emulated precisions stop growing early.
_RUN_S = 0.02


def _cpu_key() -> str:
    import torch  # the simulator loads without torch; only measuring the peaks needs it

    fp = cpu_fingerprint()
    return f"{fp['hardware']}|{fp['isa']}|torch {torch.__version__}|{probe_cache_path().name}"


def peaks_cache_path() -> Path:
    return cache_root() / "sim" / "cpu-local-peaks.json"


def _best_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: first-touch page faults and kernel selection are not the steady state
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _matmul_flops(dtype) -> float:
    """FLOP/s of a square matmul, the size doubled from 256 while one run stays under _RUN_S (up to 1024)."""
    import torch

    n = 256
    while True:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        seconds = _best_seconds(partial(torch.mm, a, b), 3)
        if n >= 1024 or seconds * 8 > _RUN_S:
            return 2 * n**3 / _best_seconds(partial(torch.mm, a, b), 5)
        n *= 2


def _measure(threads: int) -> dict[str, float]:
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        flops = {name: _matmul_flops(getattr(torch, TORCH_DTYPE_NAMES[name])) for name in DTYPES}
        int8 = flops["bf16"]  # where int8 matmul is missing, int8 runs at the bf16 rate (recorded in the result)
        int8_measured = False
        if hasattr(torch, "_int_mm"):
            try:
                n = 1024
                ai = torch.randint(-8, 8, (n, n), dtype=torch.int8)
                bi = torch.randint(-8, 8, (n, n), dtype=torch.int8)
                int8 = 2 * n**3 / _best_seconds(lambda: torch._int_mm(ai, bi), 5)
                int8_measured = True
            except RuntimeError:
                pass
        # 64 Mi floats = 256 MiB, far beyond any cache: a copy reads and writes every byte once.
        src = torch.ones(64 * 2**20, dtype=torch.float32)
        dst = torch.empty_like(src)
        bandwidth = 2 * src.numel() * 4 / _best_seconds(lambda: dst.copy_(src), 5)
    finally:
        torch.set_num_threads(previous)
    return {**{f"{name}_flops": f for name, f in flops.items()}, "int8_ops": int8, "int8_measured": int8_measured,
            "bandwidth_bps": bandwidth}


def _thread_levels(cores: int) -> list[int]:
    levels = [t for t in (1, 2, 4, 8, 16, 32, 64) if t < cores]
    return levels + [cores]


def measured_peaks(refresh: bool = False) -> dict:
    """Peaks in profile units (TFLOPS per precision, TOPS, GiB, GB/s), device_power levels (thread counts) as
    fractions, and from the capability probe: why a precision is not offered, each kernel's slowdown."""
    path = peaks_cache_path()
    key = _cpu_key()
    if not refresh and path.is_file():
        try:
            cached = json.loads(path.read_text())
            if cached.get("key") == key:
                return cached["peaks"]
        except (OSError, ValueError, KeyError):
            pass
    caps = cpu_capabilities()
    cores = num_cores()
    runs, doubted = measured_quietly(lambda: {t: _measure(t) for t in _thread_levels(cores)}, "peaks")
    # The peak is the best any thread count reached; on a machine shared with other work, more threads are not
    # always faster, and the levels keep what was seen.
    rates = [f"{name}_flops" for name in DTYPES] + ["int8_ops", "bandwidth_bps"]
    full = {k: max(r[k] for r in runs.values()) for k in rates}
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    offered = set(caps.offered)
    peaks = {
        **{f"{name}_tflops": full[f"{name}_flops"] / 1e12 for name in DTYPES if name in offered},
        "int8_tops": full["int8_ops"] / 1e12, "int8_measured": runs[cores]["int8_measured"],
        "memory_gb": round(mem_gib, 1), "bandwidth_gbs": full["bandwidth_bps"] / 1e9, "power_w": None,
        "levels": {t: {"clock": r["fp32_flops"] / full["fp32_flops"],
                       "bandwidth": r["bandwidth_bps"] / full["bandwidth_bps"]} for t, r in runs.items()},
        "precision_notes": {p.name: p.why for p in caps.precisions if not p.offered},
        "kernel_slowdown": {k.label: k.vs_plain for k in caps.kernels if k.vs_plain},
        "measured_tflops": {name: full[f"{name}_flops"] / 1e12 for name in DTYPES},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if doubted:
        return peaks
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": key, "peaks": peaks}, indent=1))
    tmp.replace(path)
    return peaks
