"""The CPU's microarchitecture (zen3, zen4, zen5, sapphirerapids, ...), from the vendor, family and model that
/proc/cpuinfo reports. Two machines of one ISA level can differ by about 1.8x per core (a Zen 4 and a Zen 5 EPYC,
both AVX-512 with bf16), so the hardware class carries it: recipes, warm starts and `verify` then keep them apart.

The tables follow the vendors' CPUID family/model assignments (AMD's Processor Programming Reference per family,
Intel's Software Developer's Manual volume 4, table 2-1), as the Linux kernel's arch/x86 model lists name them. A
pair not in them is named by its numbers (`amd-f26m99`), never guessed."""
from __future__ import annotations

import re
from pathlib import Path

__all__ = ["cpu_signature", "microarch", "MICROARCH_WORDS", "is_microarch_word"]

# AMD: (family, first model, last model) -> name. Family 23 is Zen/Zen+/Zen 2, 25 Zen 3/Zen 4, 26 Zen 5.
_AMD = (
    (23, 0x00, 0x2F, "zen"), (23, 0x30, 0xFF, "zen2"),
    (25, 0x00, 0x0F, "zen3"), (25, 0x10, 0x1F, "zen4"), (25, 0x20, 0x5F, "zen3"), (25, 0x60, 0xAF, "zen4"),
    (26, 0x00, 0xFF, "zen5"),
)
# Intel family 6: model -> name (server and recent client parts; the ones these machines are drawn from first).
_INTEL = {
    0x3F: "haswell", 0x4F: "broadwell", 0x56: "broadwell", 0x55: "skylake", 0x6A: "icelake", 0x6C: "icelake",
    0x7D: "icelake", 0x7E: "icelake", 0x8C: "tigerlake", 0x8D: "tigerlake", 0x8F: "sapphirerapids",
    0xCF: "emeraldrapids", 0xAD: "graniterapids", 0xAE: "graniterapids", 0xAF: "sierraforest",
    0x97: "alderlake", 0x9A: "alderlake", 0xB7: "raptorlake", 0xBA: "raptorlake", 0xBF: "raptorlake",
    0xAA: "meteorlake", 0xAC: "meteorlake",
}
# Skylake-SP and Cascade Lake share family 6 model 0x55; the stepping tells them apart.
_SKYLAKE_SP_STEPPINGS = {5: "cascadelake", 6: "cascadelake", 7: "cascadelake", 0xB: "cooperlake"}
MICROARCH_WORDS = frozenset({name for *_, name in _AMD} | set(_INTEL.values()) | set(_SKYLAKE_SP_STEPPINGS.values()))
_NUMBERED = re.compile(r"f\d+m\d+")


def _field(text: str, name: str) -> str | None:
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None


def cpu_signature(cpuinfo: str | None = None) -> dict[str, int | str] | None:
    """{"vendor", "family", "model", "stepping"} of the first processor; None where /proc/cpuinfo has none."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    vendor, family, model = (_field(cpuinfo, k) for k in ("vendor_id", "cpu family", "model"))
    if not vendor or not family or not model or not family.isdigit() or not model.isdigit():
        return None
    stepping = _field(cpuinfo, "stepping") or "0"
    return {"vendor": vendor, "family": int(family), "model": int(model),
            "stepping": int(stepping) if stepping.isdigit() else 0}


def microarch(signature: dict | None) -> str:
    """"zen4", "sapphirerapids", ...; "amd-f26m99" for a pair the tables lack; "unknown" without a signature."""
    if not signature:
        return "unknown"
    vendor, family, model = str(signature["vendor"]), int(signature["family"]), int(signature["model"])
    if vendor == "AuthenticAMD":
        for fam, first, last, name in _AMD:
            if fam == family and first <= model <= last:
                return name
    elif vendor == "GenuineIntel" and family == 6:
        if model == 0x55:
            return _SKYLAKE_SP_STEPPINGS.get(int(signature.get("stepping", 0)), "skylake")
        if model in _INTEL:
            return _INTEL[model]
    short = {"AuthenticAMD": "amd", "GenuineIntel": "intel"}.get(vendor, vendor.lower()[:8] or "cpu")
    return f"{short}-f{family}m{model}"


def is_microarch_word(word: str) -> bool:
    """Whether a word of a class name is a microarchitecture (a named one, or one named by its numbers)."""
    return word in MICROARCH_WORDS or bool(_NUMBERED.fullmatch(word))
