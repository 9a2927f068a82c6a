"""The capability probe decides what the space offers: on faked cpuinfo and faked figures (every kind of CPU, on
any machine), on the NPU and CUDA rules, on the simulator's profiles, and once for real on this machine."""
from __future__ import annotations

import pytest

from autotune.backends.sim import SimBackend
from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.errors import UserInputError
from autotune.host import class_note, cpu_flags, hardware_class, is_legacy_class, isa_level
from autotune.microarch import cpu_signature, microarch
from autotune.models.registry import resolve_model
from autotune.probe.accelerators import cuda_capabilities, npu_capabilities
from autotune.probe.capabilities import Capabilities, restrict_space
from autotune.probe.cpu import decide_kernels, decide_precisions
from autotune.sim.hardware import load_profile
from autotune.sim.predict import predict
from autotune.space.search_space import DEFAULT_SPACE, load_space

# /proc/cpuinfo of the machines this project has met, cut to the lines the probe reads.
ZEN3_AVX2 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse sse2 ssse3 fma "
             "sse4_1 sse4_2 avx f16c avx2 bmi2\n")
ZEN4_AVX512_BF16 = ("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: sse2 avx f16c fma avx2 avx512f avx512dq "
                    "avx512bw avx512vl avx512_vnni avx512_bf16\n")
XEON_AMX = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: avx f16c fma avx2 avx512f avx512bw "
            "avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8\n")
# Decode-shaped matmul microseconds (1 thread) as measured: AVX2 EPYC 2026-12-04 (this project's probe), Zen 4 by
# FACTS-era figures (bf16 177 us), a Xeon with AMX (fp16 native too).
AVX2_US = {"fp32": 356.0, "fp16": 1490.0, "bf16": 1717.0}
AVX512_US = {"fp32": 300.0, "fp16": 1300.0, "bf16": 177.0}
AMX_US = {"fp32": 310.0, "fp16": 150.0, "bf16": 140.0}


def _caps(text: str, figures: dict, env: dict | None = None) -> Capabilities:
    flags = cpu_flags(text)
    level = isa_level(flags, env or {})
    return Capabilities("cpu", "test CPU", decide_precisions(flags, level, figures), isa=level)


def test_isa_levels_from_cpuinfo_and_the_environment_caps():
    assert isa_level(cpu_flags(ZEN3_AVX2), {}) == "avx2"
    assert isa_level(cpu_flags(ZEN4_AVX512_BF16), {}) == "avx512bf16"
    assert isa_level(cpu_flags(XEON_AMX), {}) == "amx"
    # How an AVX-512 machine is made to behave as an AVX2 one: both caps, or either.
    caps = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    assert isa_level(cpu_flags(ZEN4_AVX512_BF16), caps) == "avx2"
    assert isa_level(cpu_flags(XEON_AMX), {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}) == "avx512bf16"
    assert isa_level(cpu_flags(XEON_AMX), {"ONEDNN_MAX_CPU_ISA": "ALL"}) == "amx"  # no cap
    assert isa_level(cpu_flags("flags : sse2\n"), {}) == "sse"


def test_class_names_carry_the_isa_level():
    avx2 = hardware_class("AMD EPYC", isa_level(cpu_flags(ZEN3_AVX2), {}), 2)
    bf16 = hardware_class("AMD EPYC", isa_level(cpu_flags(ZEN4_AVX512_BF16), {}), 2)
    assert (avx2, bf16) == ("cpu-amd-epyc-avx2-2c", "cpu-amd-epyc-avx512bf16-2c")
    assert hardware_class("Intel(R) Xeon(R) Processor", "amx", 2) == "cpu-intel-xeon-processor-amx-2c"
    assert is_legacy_class("cpu-amd-epyc-2c") and not is_legacy_class(avx2) and not is_legacy_class("cuda-h100")


def _signature(vendor: str, family: int, model: int, stepping: int = 1) -> str:
    return (f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
            f"model name\t: X\nstepping\t: {stepping}\n")


@pytest.mark.parametrize("vendor, family, model, stepping, name", [
    ("AuthenticAMD", 25, 1, 1, "zen3"),  # EPYC 7003 (Milan): the AVX2 machine
    ("AuthenticAMD", 25, 17, 1, "zen4"),  # EPYC 9004 (Genoa): the AVX-512 bf16 machine
    ("AuthenticAMD", 26, 2, 1, "zen5"),  # EPYC 9005 (Turin): same flags as Zen 4, about 1.8x per core
    ("AuthenticAMD", 23, 49, 0, "zen2"),
    ("GenuineIntel", 6, 143, 8, "sapphirerapids"),
    ("GenuineIntel", 6, 85, 7, "cascadelake"),
    ("GenuineIntel", 6, 85, 4, "skylake"),
    ("AuthenticAMD", 99, 2, 0, "amd-f99m2"),  # not in the tables: named by its numbers, never guessed
])
def test_the_microarchitecture_comes_from_vendor_family_and_model(vendor, family, model, stepping, name):
    assert microarch(cpu_signature(_signature(vendor, family, model, stepping))) == name


def test_class_names_tell_a_zen4_from_a_zen5_and_older_names_say_what_they_lack():
    zen4 = hardware_class("AMD EPYC", "avx512bf16", 2, microarch(cpu_signature(_signature("AuthenticAMD", 25, 17))))
    zen5 = hardware_class("AMD EPYC", "avx512bf16", 2, microarch(cpu_signature(_signature("AuthenticAMD", 26, 2))))
    assert (zen4, zen5) == ("cpu-amd-epyc-zen4-avx512bf16-2c", "cpu-amd-epyc-zen5-avx512bf16-2c")
    assert class_note(zen4) is None and class_note(zen5) is None and class_note("cuda-h100") is None
    assert "before classes carried the microarchitecture" in class_note("cpu-amd-epyc-avx512bf16-2c")
    assert "before classes carried the microarchitecture" in class_note("llamacpp-cpu-amd-epyc-avx512bf16-2c")
    assert "before classes carried the ISA level" in class_note("cpu-amd-epyc-2c")
    assert microarch(None) == "unknown" and cpu_signature("flags\t: avx2\n") is None


def test_avx2_offers_fp32_first_and_drops_the_emulated_precisions_with_their_figures():
    caps = _caps(ZEN3_AVX2, AVX2_US)
    assert caps.offered == ("fp32",) and caps.fastest == "fp32"
    bf16 = caps.precision("bf16")
    assert bf16 is not None and not bf16.native and not bf16.offered
    assert "emulated" in bf16.why and "1,717 us" in bf16.why and "4.82x" in bf16.why
    space = restrict_space(load_space(DEFAULT_SPACE), caps)
    assert space.dimension("dtype").values == ("fp32",)
    assert "bf16" in space.dropped["dtype"] and "emulated" in space.dropped["dtype"]
    assert space.baseline_params()["dtype"] == "fp32"  # `dtype: fastest`


def test_avx512_bf16_keeps_bf16_and_leads_with_it_where_it_is_faster():
    caps = _caps(ZEN4_AVX512_BF16, AVX512_US)
    assert caps.offered == ("bf16", "fp32")
    space = restrict_space(load_space(DEFAULT_SPACE), caps)
    assert space.dimension("dtype").values == ("bf16", "fp32") and space.baseline_params()["dtype"] == "bf16"
    # Capped to AVX2 by the environment, the same machine's bf16 is emulated: had it measured slow, it goes.
    capped = _caps(ZEN4_AVX512_BF16, AVX2_US, {"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert capped.offered == ("fp32",)


def test_a_space_that_names_no_precision_computes_in_the_fastest_one(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("dimensions:\n  quant: {values: [none, w8a16]}\n  batch_size: {values: [4, 8]}\n")
    space = restrict_space(load_space(path), _caps(ZEN3_AVX2, AVX2_US))
    assert space.dimension("dtype").values == ("fp32",) and "names no dtype" in space.dropped["dtype"]
    assert all(DeployConfig.from_params(p).dtype == "fp32" for p in space.grid())


def test_amx_offers_every_precision_fastest_first():
    assert _caps(XEON_AMX, AMX_US).offered == ("bf16", "fp16", "fp32")


def test_a_precision_without_instructions_but_measured_close_to_fp32_is_kept_and_said_so():
    caps = _caps(ZEN3_AVX2, {"fp32": 300.0, "fp16": 1200.0, "bf16": 400.0})
    assert caps.offered == ("fp32", "bf16")
    bf16 = caps.precision("bf16")
    assert bf16 is not None and not bf16.native and "kept" in bf16.why


def test_slow_kernels_are_kept_but_ordered_last():
    kernels = decide_kernels({"w8a16@fp32": 590.0, "w4a16@fp32": 14811.0, "w8a8@fp32": "no int8 kernel"},
                             {"fp32": 356.0})
    slow = {k.label: k.slow for k in kernels}
    assert slow == {"w8a16@fp32": False, "w4a16@fp32": True, "w8a8@fp32": True}
    caps = Capabilities("cpu", "t", _caps(ZEN3_AVX2, AVX2_US).precisions, kernels)
    space = restrict_space(load_space(DEFAULT_SPACE), caps)
    assert set(space.ordered_last) == {"w4a16@fp32", "w8a8@fp32"} and "41.60x" in space.ordered_last["w4a16@fp32"]
    assert "w4a16" in space.dimension("quant").values  # kept: its memory is worth a trial


@pytest.mark.parametrize("soc, offered", [("Ascend910A", ("fp16",)), ("Ascend910ProB", ("fp16",)),
                                          ("Ascend910B2", ("bf16", "fp16")), ("Ascend910_9391", ("bf16", "fp16")),
                                          (None, ("fp16",))])
def test_npu_precisions_follow_the_soc(soc, offered):
    caps = npu_capabilities(soc)
    assert caps.offered == offered
    if "bf16" not in offered:
        assert "910B" in caps.precision("bf16").why  # type: ignore[union-attr]


def test_cuda_precisions_follow_the_compute_capability():
    assert cuda_capabilities("Tesla T4", (7, 5)).offered == ("fp16", "fp32")
    a100 = cuda_capabilities("A100", (8, 0))
    assert a100.offered == ("bf16", "fp16", "fp32") and a100.figures["fp8"] is False
    assert cuda_capabilities("H100", (9, 0)).figures["fp8"] is True


def test_the_ascend910_profile_has_no_bf16_and_its_space_computes_fp16():
    profile = load_profile("ascend910")
    assert set(profile.tflops) == {"fp16"} and profile.fastest_precision == "fp16"
    backend = SimBackend("ascend910")
    space = backend.adapt_space(load_space(DEFAULT_SPACE))
    assert space.dimension("dtype").values == ("fp16",) and "910B" in space.dropped["dtype"]
    with pytest.raises(UserInputError, match="does not compute bf16"):
        predict(resolve_model("llama-7b"), DeployConfig(quant="w8a16", dtype="bf16"), Workload(), profile)
    b2 = SimBackend("ascend910b2").adapt_space(load_space(DEFAULT_SPACE))
    assert b2.dimension("dtype").values[0] == "bf16" and "fp32" in b2.dropped["dtype"]


def test_fp32_weights_cost_the_simulator_twice_the_bytes():
    spec, profile = resolve_model("llama-7b"), load_profile("a100-80g")
    fp32 = predict(spec, DeployConfig(quant="none", dtype="fp32", batch_size=1), Workload(), profile)
    bf16 = predict(spec, DeployConfig(quant="none", dtype="bf16", batch_size=1), Workload(), profile)
    assert fp32.breakdown["weights_mb"] == pytest.approx(2 * bf16.breakdown["weights_mb"], rel=1e-6)
    # Every byte a decode step moves (weights, KV, activations) doubles; overheads do not.
    assert fp32.breakdown["decode_memory_ms"] == pytest.approx(2 * bf16.breakdown["decode_memory_ms"], rel=1e-6)
    assert fp32.tpot_p50_ms > 1.4 * bf16.tpot_p50_ms


@pytest.mark.slow
def test_the_real_probe_on_this_machine(tmp_path, monkeypatch):
    """Seconds, once: the figures are measured here and the decision follows from them and the flags."""
    from autotune.probe.cpu import cpu_capabilities, native_precisions

    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path))
    caps = cpu_capabilities()
    assert caps.fastest in caps.offered and "fp32" in caps.offered
    native = native_precisions(cpu_flags(), isa_level())
    for p in caps.precisions:
        assert p.decode_us and p.decode_us > 0
        ratio = p.decode_us / caps.precision("fp32").decode_us  # type: ignore[union-attr]
        assert p.offered == (p.name in native or ratio <= 1.5), p.why
    assert cpu_capabilities() == caps  # cached: the second call measures nothing
