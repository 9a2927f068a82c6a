"""Peaks of this machine's CPU, measured (not looked up): a matmul and a memory-copy micro-benchmark per thread
count, cached under the autotune cache so that a profile load costs nothing after the first time."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from autotune.host import cpu_fingerprint, num_cores
from autotune.paths import cache_root

__all__ = ["measured_peaks", "peaks_cache_path"]


def _cpu_key() -> str:
    import torch  # the simulator loads without torch; only measuring the peaks needs it

    fp = cpu_fingerprint()
    return f"{fp['hardware']}|{fp['isa']}|torch {torch.__version__}"


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


def _measure(threads: int) -> dict[str, float]:
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = 1024
        a = torch.randn(n, n, dtype=torch.bfloat16)
        b = torch.randn(n, n, dtype=torch.bfloat16)
        bf16 = 2 * n**3 / _best_seconds(lambda: torch.mm(a, b), 5)
        int8 = bf16  # where int8 matmul is missing, int8 runs at the bf16 rate (recorded in the result)
        int8_measured = False
        if hasattr(torch, "_int_mm"):
            try:
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
    return {"bf16_flops": bf16, "int8_ops": int8, "int8_measured": int8_measured, "bandwidth_bps": bandwidth}


def _thread_levels(cores: int) -> list[int]:
    levels = [t for t in (1, 2, 4, 8, 16, 32, 64) if t < cores]
    return levels + [cores]


def measured_peaks(refresh: bool = False) -> dict:
    """Peaks in profile units (TFLOPS, TOPS, GiB, GB/s) and device_power levels (thread counts) as fractions."""
    path = peaks_cache_path()
    key = _cpu_key()
    if not refresh and path.is_file():
        try:
            cached = json.loads(path.read_text())
            if cached.get("key") == key:
                return cached["peaks"]
        except (OSError, ValueError, KeyError):
            pass
    cores = num_cores()
    runs = {t: _measure(t) for t in _thread_levels(cores)}
    # The peak is the best any thread count reached; on a machine shared with other work, more threads are not
    # always faster, and the levels keep what was seen.
    full = {k: max(r[k] for r in runs.values()) for k in ("bf16_flops", "int8_ops", "bandwidth_bps")}
    full["int8_measured"] = runs[cores]["int8_measured"]
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    peaks = {
        "bf16_tflops": full["bf16_flops"] / 1e12, "int8_tops": full["int8_ops"] / 1e12,
        "int8_measured": full["int8_measured"], "memory_gb": round(mem_gib, 1),
        "bandwidth_gbs": full["bandwidth_bps"] / 1e9, "power_w": None,
        "levels": {t: {"clock": r["bf16_flops"] / full["bf16_flops"],
                       "bandwidth": r["bandwidth_bps"] / full["bandwidth_bps"]} for t, r in runs.items()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": key, "peaks": peaks}, indent=1))
    tmp.replace(path)
    return peaks
