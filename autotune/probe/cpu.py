"""The CPU's capability probe: its ISA flags and level (autotune/host.py), and a microbenchmark of one decode-shaped
matmul per precision and per quantized kernel, on one thread; cached per machine, so that it costs seconds once.

Which precisions are native follows from the flags; whether an emulated one is still worth offering follows from
the figures (`decide_precisions`, pure, so that it is tested on faked flags and figures)."""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from autotune.code_hash import code_hash
from autotune.config.deploy import DTYPES, QUANT_SCHEMES, TORCH_DTYPE_NAMES
from autotune.contention import measured_quietly
from autotune.errors import AutotuneError
from autotune.host import ISA_FLAGS, cpu_flags, cpu_model, hardware_class, isa_caps, isa_level, num_cores
from autotune.microarch import cpu_signature, microarch
from autotune.paths import cache_root
from autotune.probe.capabilities import EMULATED_RATIO, SLOW_KERNEL_RATIO, Capabilities, Kernel, Precision
from autotune.probe.compile_time import measure_compile_s
from autotune.progress import log

__all__ = ["DECODE_SHAPE", "native_precisions", "decide_precisions", "decide_kernels", "measure", "cpu_capabilities",
           "probe_cache_path"]

PROBE_VERSION = "2"  # 2: the compile probe and the matmul rate per batch size
# rows, in, out: the gate projection of a SmolLM2-sized decode step at batch 8 (8x576 @ 576x1536).
DECODE_SHAPE = (8, 576, 1536)
# The batch sizes at which the same matmul's rate is measured: the ceiling a trial's decode is read against.
RATE_ROWS = (1, 2, 4, 8, 16, 32, 64)
_NATIVE_FLAGS = {"bf16": "avx512_bf16 or amx_bf16", "fp16": "avx512_fp16 or amx_fp16"}


def native_precisions(flags: frozenset[str], level: str) -> set[str]:
    """Precisions the CPU's instructions compute at this level (fp32 always)."""
    native = {"fp32"}
    if level in ("avx512bf16", "amx"):
        native.add("bf16")
    if ("avx512_fp16" in flags and level in ("avx512bf16", "amx")) or ("amx_fp16" in flags and level == "amx"):
        native.add("fp16")
    return native


def decide_precisions(flags: frozenset[str], level: str, decode_us: dict[str, float | None]) -> tuple[Precision, ...]:
    """Each precision offered when native, or emulated within EMULATED_RATIO of fp32; fastest offered first."""
    native = native_precisions(flags, level)
    fp32 = decode_us.get("fp32")
    rows, k, n = DECODE_SHAPE
    shape = f"a decode-shaped matmul ({rows}x{k} @ {k}x{n}, 1 thread)"
    out = []
    for name in DTYPES:
        us = decode_us.get(name)
        ratio = us / fp32 if us is not None and fp32 else None
        figure = (f"{shape} took {us:,.0f} us against fp32's {fp32:,.0f} us ({ratio:.2f}x)" if ratio is not None
                  else "not measured")
        if name in native:
            out.append(Precision(name, True, True, f"native at ISA level {level}; {figure}", us))
        elif ratio is not None and ratio <= EMULATED_RATIO:
            out.append(Precision(name, False, True, f"no {_NATIVE_FLAGS[name]} at ISA level {level}, but {figure}, "
                                                    f"within {EMULATED_RATIO}x: kept", us))
        else:
            out.append(Precision(name, False, False, f"emulated: no {_NATIVE_FLAGS.get(name, 'native support')} at "
                                                     f"ISA level {level}; {figure}", us))
    return tuple(sorted(out, key=lambda p: (not p.offered, p.decode_us if p.decode_us is not None else float("inf"))))


def decide_kernels(kernel_us: dict[str, float | str], plain_us: dict[str, float | None]) -> tuple[Kernel, ...]:
    """`kernel_us`: "scheme@dtype" -> microseconds, or the reason it cannot run here."""
    out = []
    for label, value in kernel_us.items():
        scheme, dtype = label.split("@")
        plain = plain_us.get(dtype)
        if isinstance(value, str):
            out.append(Kernel(scheme, dtype, None, None, True, f"cannot run here: {value}"))
            continue
        ratio = value / plain if plain else None
        slow = ratio is not None and ratio > SLOW_KERNEL_RATIO
        what = f"{value:,.0f} us against the plain {dtype} matmul's {plain:,.0f} us ({ratio:.2f}x)" if ratio else \
            f"{value:,.0f} us"
        out.append(Kernel(scheme, dtype, value, ratio, slow,
                          f"{what}: {'slower than ' + str(SLOW_KERNEL_RATIO) + 'x, ordered last' if slow else 'kept'}"))
    return tuple(out)


def _median_us(fn, budget_s: float = 0.25, max_reps: int = 50) -> float:
    fn()  # warm-up: first-touch faults and kernel selection are not the steady state
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < 3 or (len(times) < max_reps and time.perf_counter() - started < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _kernel_us(scheme: str, dtype, x) -> float | str:
    import torch
    from torch import nn

    from autotune.engine.quant import QUANTIZERS

    _, k, n = DECODE_SHAPE
    model = nn.Sequential(nn.Linear(k, n, bias=False, dtype=dtype)).eval()
    try:
        QUANTIZERS[scheme]().apply(model, lambda m, fqn: isinstance(m, nn.Linear))
        with torch.inference_mode():
            return _median_us(lambda: model(x))
    except (AutotuneError, RuntimeError, NotImplementedError, ValueError) as exc:
        return " ".join(str(exc).split())[:200]


def measure() -> dict:
    """Microseconds of the decode-shaped matmul per precision, and of each quantized scheme's linear at each
    precision, on one thread."""
    import torch

    rows, k, n = DECODE_SHAPE
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        plain: dict[str, float | None] = {}
        kernels: dict[str, float | str] = {}
        with torch.inference_mode():
            for name in DTYPES:
                x = torch.randn(rows, k, dtype=getattr(torch, TORCH_DTYPE_NAMES[name]))
                w = torch.randn(n, k, dtype=getattr(torch, TORCH_DTYPE_NAMES[name]))
                plain[name] = _median_us(partial(torch.nn.functional.linear, x, w))
        for name in DTYPES:
            x = torch.randn(rows, k, dtype=getattr(torch, TORCH_DTYPE_NAMES[name]))
            for scheme in QUANT_SCHEMES:
                if scheme != "none":
                    kernels[f"{scheme}@{name}"] = _kernel_us(scheme, getattr(torch, TORCH_DTYPE_NAMES[name]), x)
    finally:
        torch.set_num_threads(previous)
    return {"threads": 1, "shape": list(DECODE_SHAPE), "plain_us": plain, "kernel_us": kernels}


def measure_rates(dtypes: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """GFLOP/s of the decode-shaped matmul on one thread, per precision and per row count (RATE_ROWS)."""
    import torch

    _, k, n = DECODE_SHAPE
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    rates: dict[str, dict[str, float]] = {}
    try:
        with torch.inference_mode():
            for name in dtypes:
                dtype = getattr(torch, TORCH_DTYPE_NAMES[name])
                w = torch.randn(n, k, dtype=dtype)
                rates[name] = {}
                for rows in RATE_ROWS:
                    x = torch.randn(rows, k, dtype=dtype)
                    us = _median_us(partial(torch.nn.functional.linear, x, w), budget_s=0.15)
                    rates[name][str(rows)] = round(2 * rows * k * n / us / 1e3, 2)
    finally:
        torch.set_num_threads(previous)
    return rates


def _compile_s() -> dict:
    """The best of two timings of the small inductor compile (probe/compile_time.py): the first may pay for the
    compiler's files coming from disk."""
    try:
        return {"compile_s": min(measure_compile_s() for _ in range(2))}
    except AutotuneError as exc:
        log(f"probe: {exc}; compile costs fall back to fixed priors")
        return {"compile_s": None, "compile_error": str(exc)}


def _key() -> str:
    versions = {}
    for package in ("torch", "torchao"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = "absent"
    text = json.dumps([PROBE_VERSION, code_hash(), cpu_model(), cpu_signature(), num_cores(),
                       sorted(cpu_flags() & set(ISA_FLAGS)),
                       isa_caps(), versions], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def probe_cache_path() -> Path:
    return cache_root() / "probe" / f"cpu-{_key()}.json"


def cpu_capabilities(refresh: bool = False) -> Capabilities:
    """This CPU's capabilities, probed once per machine, torch build and environment caps (cached)."""
    path = probe_cache_path()
    if not refresh and path.is_file():
        try:
            return Capabilities.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged cache entry is probed again
    flags, level = cpu_flags(), isa_level()
    log(f"probe: {cpu_model()}, ISA level {level}: timing a decode-shaped matmul per precision and kernel")
    started = time.perf_counter()
    figures, doubted = measured_quietly(measure, "probe")
    precisions = decide_precisions(flags, level, figures["plain_us"])
    offered = {p.name for p in precisions if p.offered}
    kernels = decide_kernels({k: v for k, v in figures["kernel_us"].items() if k.split("@")[1] in offered},
                             figures["plain_us"])
    figures["rate_gflops"] = measure_rates(tuple(p.name for p in precisions if p.offered))
    figures.update(_compile_s())
    caps = Capabilities("cpu", cpu_model(), precisions, kernels, level, tuple(sorted(flags & set(ISA_FLAGS))),
                        {**figures, "hardware": hardware_class(cpu_model(), level, num_cores(),
                                                               microarch(cpu_signature()))},
                        round(time.perf_counter() - started, 2))
    if not doubted:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(caps.to_dict(), indent=1))
        tmp.replace(path)
    for p in caps.precisions:
        log(f"probe: {p.name} {'offered' if p.offered else 'dropped'}: {p.why}")
    if figures.get("compile_s") is not None:
        log(f"probe: a small inductor compile took {figures['compile_s']:.1f} s here (compile costs are predicted "
            "from it until the study measures its own)")
    return caps
