"""The accelerator backends' pure parts, which run everywhere: knob -> torchair / torch_npu / torch.compile
mappings, the dimensions each drops and why, weight packing, and the one-line refusal on a machine without them."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from autotune.backends.cuda import CudaBackend
from autotune.backends.npu import NpuBackend
from autotune.config.deploy import FUSION_LEVELS, QUANT_SCHEMES
from autotune.devices.cuda import CUDA_COMPILE, CudaDevice, cuda_unavailable
from autotune.devices.npu import NpuDevice, npu_unavailable
from autotune.devices.npu_mapping import (
    NPU_UNSUPPORTED_QUANT,
    TorchairSettings,
    npu_power_reason,
    npu_quant_op,
    torchair_settings,
)
from autotune.devices.npu_quant import quantize_weight_int8
from autotune.space.search_space import load_space


def test_torchair_settings_per_fusion_level():
    assert torchair_settings("O0") is None
    assert torchair_settings("O1") == TorchairSettings(mode="max-autotune", oo_level="O1")
    assert torchair_settings("O2") == TorchairSettings(mode="max-autotune", oo_level="O3")
    for level in FUSION_LEVELS[1:]:  # the values torchair's OptionValues accept
        settings = torchair_settings(level)
        assert settings.mode in ("max-autotune", "reduce-overhead") and settings.oo_level in ("O1", "O3")
    with pytest.raises(KeyError):
        torchair_settings("O3")


def test_npu_quant_ops_cover_every_scheme_or_say_why_not():
    assert npu_quant_op("bf16") is None
    assert npu_quant_op("w8a16") == ("npu_weight_quant_batchmatmul",)
    assert npu_quant_op("w8a8") == ("npu_dynamic_quant", "npu_quant_matmul")
    for scheme in QUANT_SCHEMES:
        if scheme in NPU_UNSUPPORTED_QUANT:
            with pytest.raises(KeyError):
                npu_quant_op(scheme)
        else:
            npu_quant_op(scheme)


def test_npu_power_is_dropped_with_the_reason():
    assert "only reads" in npu_power_reason("Ascend910B2")
    assert "only reads" in npu_power_reason(None)
    assert "not set them yet" in npu_power_reason("Atlas 200I A2")


def test_npu_device_maps_fusion_to_compile_options():
    dev = NpuDevice()
    assert dev.compile_options("O0") is None
    o2 = dev.compile_options("O2")
    assert o2.backend == "torchair" and o2.mode == "max-autotune" and o2.settings["oo_level"] == "O3"
    assert dev.compile_options("O1").settings["oo_level"] == "O1"


def test_npu_space_drops_power_and_int4_with_reasons():
    space = NpuBackend().adapt_space(load_space())
    assert "device_power" not in {d.name for d in space.dimensions}
    assert "AI Core clock" in space.dropped["device_power"]
    assert "w4a16" not in space.dimension("quant").values and "int4" in space.dropped["quant"]


def test_cuda_compile_passes_each_level_to_torch_compile(monkeypatch):
    """What CudaDevice.compile hands torch.compile (recorded, no GPU needed): O2 is max-autotune with CUDA graphs
    (as inductor defines the mode) and freezing; O1 neither; O0 is not compiled."""
    import torch._inductor
    import torch._inductor.config

    calls: list[tuple[dict, bool]] = []

    def record(fn, **kwargs):
        calls.append((kwargs, torch._inductor.config.freezing))
        return fn

    monkeypatch.setattr(torch, "compile", record)
    monkeypatch.setattr(torch._inductor.config, "freezing", False)  # restored after: compile sets it globally

    def fn(x):
        return x

    device = CudaDevice()
    assert device.compile(fn, "O0") is fn and calls == []
    device.compile(fn, "O1")
    device.compile(fn, "O2")
    (o1, o1_freezing), (o2, o2_freezing) = calls
    assert o1 == {"mode": "default"} and not o1_freezing
    assert o2 == {"mode": "max-autotune"} and o2_freezing
    assert torch._inductor.list_mode_options(o2["mode"]).get("triton.cudagraphs") is True
    assert not torch._inductor.list_mode_options(o1["mode"]).get("triton.cudagraphs")
    assert CUDA_COMPILE["O0"] is None and device.compile_options("O2") is CUDA_COMPILE["O2"]


def test_cuda_space_drops_power_with_reason():
    space = CudaBackend().adapt_space(load_space())
    assert "device_power" not in {d.name for d in space.dimensions}
    assert "nvidia-smi" in space.dropped["device_power"]
    assert space.dimension("quant").values == load_space().dimension("quant").values


def test_cuda_int4_uses_the_tinygemm_layout():
    assert CudaDevice().quantizer("w4a16").config().int4_packing_format == "tile_packed_to_4d"


def test_int8_weight_packing_round_trips():
    torch.manual_seed(0)
    w = torch.randn(64, 128)
    codes, scale = quantize_weight_int8(w)
    assert codes.dtype == torch.int8 and codes.shape == (64, 128) and scale.shape == (64,)
    err = ((codes.float() * scale[:, None]) - w).abs().max()
    assert err <= scale.max() / 2 + 1e-6  # rounding error at most half a step


@pytest.mark.parametrize("name, check, words", [("cuda", cuda_unavailable, "torch"),
                                                 ("npu", npu_unavailable, "torch_npu")])
def test_absent_accelerator_refuses_in_one_line(name, check, words):
    reason = check()
    if reason is None:
        pytest.skip(f"{name} is present here")
    assert "\n" not in reason and words in reason
    proc = subprocess.run([sys.executable, "-m", "autotune.cli", "search", "--backend", name],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("autotune:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert name in lines[0] and words in lines[0]
