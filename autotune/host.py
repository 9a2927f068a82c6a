"""Facts about this machine's CPU: its model, the cores this process may use, its instruction-set level, and the
fingerprint that names its hardware class (recipes are kept per class)."""
from __future__ import annotations

import os
import platform
import re
from collections.abc import Mapping
from pathlib import Path

from autotune.microarch import cpu_signature, is_microarch_word, microarch

__all__ = ["cpu_model", "num_cores", "cpu_flags", "isa_level", "ISA_LEVELS", "ISA_FLAGS", "isa_caps",
           "hardware_class", "is_legacy_class", "class_note", "cpu_fingerprint"]

# Instruction-set levels that change what a CPU computes natively, lowest first. "avx2": fp32 only (bf16 and fp16
# emulated); "avx512": wider fp32; "avx512bf16": native bf16 dot products; "amx": bf16/int8 tile matmuls.
ISA_LEVELS = ("sse", "avx2", "avx512", "avx512bf16", "amx")
# The /proc/cpuinfo flags the probe reports (and the level is read from).
ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_bf16", "amx_int8", "amx_fp16")
# oneDNN's ONEDNN_MAX_CPU_ISA values (its documentation's names) -> the level they cap kernels at.
_ONEDNN_CAPS = {"SSE41": "sse", "AVX": "sse", "AVX2": "avx2", "AVX2_VNNI": "avx2", "AVX2_VNNI_2": "avx2",
                "AVX512_CORE": "avx512", "AVX512_CORE_VNNI": "avx512", "AVX512_CORE_BF16": "avx512bf16",
                "AVX10_1_512": "avx512bf16", "AVX512_CORE_FP16": "avx512bf16", "AVX512_CORE_AMX": "amx",
                "AVX10_1_512_AMX": "amx", "AVX512_CORE_AMX_FP16": "amx", "AVX10_1_512_AMX_FP16": "amx"}
# ATen's ATEN_CPU_CAPABILITY values -> the level of its vectorised kernels.
_ATEN_CAPS = {"default": "sse", "avx2": "avx2", "avx512": "avx512"}
_LEVEL_WORDS = frozenset(ISA_LEVELS)


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


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The flags of the first processor in /proc/cpuinfo (or in the given text); empty where there is none."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def _flags_level(flags: frozenset[str]) -> str:
    if {"amx_tile", "amx_bf16"} <= flags:
        return "amx"
    if {"avx512f", "avx512_bf16"} <= flags:
        return "avx512bf16"
    if {"avx512f", "avx512bw"} <= flags:
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return "sse"


def isa_caps(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment variables that cap the kernels torch may pick, where they are set."""
    env = os.environ if env is None else env
    return {k: env[k] for k in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY") if env.get(k)}


def isa_level(flags: frozenset[str] | None = None, env: Mapping[str, str] | None = None) -> str:
    """The level torch's kernels run at here: what the CPU has, capped by ONEDNN_MAX_CPU_ISA (oneDNN's matmuls,
    where bf16 is native or emulated) and ATEN_CPU_CAPABILITY (ATen's vectorised kernels). Setting both to AVX2
    on an AVX-512 machine gives an AVX2 machine's behaviour, and its class."""
    flags = cpu_flags() if flags is None else flags
    caps = isa_caps(env)
    levels = [_flags_level(flags)]
    onednn = caps.get("ONEDNN_MAX_CPU_ISA") or caps.get("DNNL_MAX_CPU_ISA")
    if onednn and onednn.upper() in _ONEDNN_CAPS:
        levels.append(_ONEDNN_CAPS[onednn.upper()])
    aten = caps.get("ATEN_CPU_CAPABILITY")
    if aten and aten.lower() in _ATEN_CAPS:
        levels.append(_ATEN_CAPS[aten.lower()])
    return min(levels, key=ISA_LEVELS.index)


def hardware_class(model: str, level: str, cores: int, arch: str | None = None) -> str:
    """"cpu-amd-epyc-zen4-avx512bf16-2c": the model's first words, the microarchitecture, the ISA level, the cores.
    Two machines whose bf16 is native on one and emulated on the other are two classes, and so are two of one level
    whose cores differ in speed (a Zen 4 and a Zen 5), so that a recipe of one is never taken for the other's.
    `arch` None gives the older name, without the microarchitecture (as recipes before it were named)."""
    slug = "-".join(w for w in model.lower().replace("(r)", "").replace("(tm)", "").split()[:3] if w.isalnum())
    return f"cpu-{slug or 'unknown'}-" + (f"{arch}-" if arch else "") + f"{level}-{cores}c"


def is_legacy_class(name: str) -> bool:
    """A CPU class named before classes carried the ISA level ("cpu-amd-epyc-2c"): its recipes may come from any
    level of that CPU family."""
    words = name.split("-")
    return words[0] == "cpu" and bool(re.fullmatch(r"\d+c", words[-1])) and not _LEVEL_WORDS & set(words)


def _lacks_microarch(name: str) -> bool:
    words = name.split("-")
    if words[0] in ("llamacpp", "openvino"):  # a peer runtime's classes are a CPU class behind its name
        words = words[1:]
    return (words[:1] == ["cpu"] and bool(_LEVEL_WORDS & set(words))
            and not any(is_microarch_word(w) for w in words) and "unknown" not in words)


def class_note(name: str) -> str | None:
    """What a reader must know of a CPU class named under an older rule, or None for a class of today's rule."""
    if is_legacy_class(name):
        return (f"{name} was named before classes carried the ISA level: it may come from any ISA level of that CPU "
                "(bf16 native on one, emulated on another)")
    if _lacks_microarch(name):
        return (f"{name} was named before classes carried the microarchitecture: it may come from any CPU of that "
                "ISA level (a Zen 4 and a Zen 5 of one level differ by about 1.8x per core)")
    return None


def cpu_fingerprint() -> dict:
    model = cpu_model()
    cores = num_cores()
    import torch  # here, not at the top: choosing a backend must not load torch

    flags = cpu_flags()
    level = isa_level(flags)
    signature = cpu_signature()
    arch = microarch(signature)
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "hardware": hardware_class(model, level, cores, arch),
        "cpu": model, "microarch": arch, **({"cpu_signature": signature} if signature else {}), "cores": cores,
        "isa": torch.backends.cpu.get_cpu_capability(), "isa_level": level,
        "isa_flags": sorted(flags & set(ISA_FLAGS)), **({"isa_caps": isa_caps()} if isa_caps() else {}),
        "memory_gib": round(mem_gib, 1), "machine": platform.machine(), "os": platform.platform(terse=True),
    }
