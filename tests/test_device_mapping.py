"""The accelerator backends' pure parts, which run everywhere: knob -> torchair / torch_npu / torch.compile
mappings, the dimensions each drops and why, weight packing, and the one-line refusal on a machine without them."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import make_tiny_llama
from torch import nn

from autotune.backends.cuda import CudaBackend
from autotune.backends.npu import NpuBackend
from autotune.config.deploy import FUSION_LEVELS, QUANT_SCHEMES, DeployConfig
from autotune.devices.cuda import CUDA_COMPILE, CudaDevice, cuda_unavailable
from autotune.devices.cuda_quant import CUDA_QUANTIZERS, CudaW4A16, CudaW8A8
from autotune.devices.npu import NpuDevice, npu_unavailable
from autotune.devices.npu_mapping import (
    NPU_UNSUPPORTED_QUANT,
    TorchairSettings,
    npu_power_reason,
    npu_quant_op,
    torchair_settings,
)
from autotune.devices.npu_quant import quantize_weight_int8
from autotune.engine.calibrated import quantize_layers
from autotune.engine.int_mm import INT_MM_MIN_ROWS, RowPadded, pad_rows
from autotune.engine.model import EngineModel
from autotune.engine.quant import W8A16, Baseline, decoder_linear_names
from autotune.errors import TrialFailure
from autotune.probe.accelerators import cuda_capabilities
from autotune.space.search_space import load_space
from autotune.trial.child import address_space_limited


def test_torchair_settings_per_fusion_level():
    assert torchair_settings("O0") is None
    assert torchair_settings("O1") == TorchairSettings(mode="max-autotune", oo_level="O1", dynamic=True)
    assert torchair_settings("O2") == TorchairSettings(mode="max-autotune", oo_level="O3", dynamic=True)
    for level in FUSION_LEVELS[1:]:  # the values torchair's OptionValues accept
        settings = torchair_settings(level)
        assert settings.mode in ("max-autotune", "reduce-overhead") and settings.oo_level in ("O1", "O3")
    with pytest.raises(KeyError):
        torchair_settings("O3")


def test_npu_quant_ops_cover_every_scheme_or_say_why_not():
    assert npu_quant_op("none") is None
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
    # dynamic=True: prefill one dynamic GE graph, decode marked static call by call (test_device_graphs.py)
    assert all(dev.compile_options(level).settings["dynamic"] for level in ("O1", "O2"))


def test_npu_space_drops_power_and_int4_with_reasons():
    space = NpuBackend().adapt_space(load_space())
    assert "device_power" not in {d.name for d in space.dimensions}
    assert "AI Core clock" in space.dropped["device_power"]
    assert "w4a16" not in space.dimension("quant").values and "int4" in space.dropped["quant"]


def test_cuda_compile_passes_each_level_to_torch_compile(monkeypatch):
    """What CudaDevice.compile hands torch.compile (recorded, no GPU needed): O2 is max-autotune with CUDA graphs
    (as inductor defines the mode) and no freezing (it would make each new KV pool a recompile:
    test_device_graphs.py has the pools as static inputs instead); O1 default; O0 is not compiled."""
    import torch._inductor
    import torch._inductor.config

    calls: list[tuple[dict, bool]] = []

    def record(fn, **kwargs):
        calls.append((kwargs, torch._inductor.config.freezing))
        return fn

    monkeypatch.setattr(torch, "compile", record)

    def fn(x):
        return x

    device = CudaDevice()
    # compile sets freezing globally: the config's own patch restores it (monkeypatch's undo deletes the option
    # from inductor's config module, and later compiles fail with "freezing does not exist")
    with torch._inductor.config.patch(freezing=True):
        assert device.compile(fn, "O0") is fn and calls == []
        device.compile(fn, "O1")
        device.compile(fn, "O2")
    (o1, o1_freezing), (o2, o2_freezing) = calls
    assert o1 == {"mode": "default"} and not o1_freezing
    assert o2 == {"mode": "max-autotune"} and not o2_freezing
    assert torch._inductor.list_mode_options(o2["mode"]).get("triton.cudagraphs") is True
    assert not torch._inductor.list_mode_options(o1["mode"]).get("triton.cudagraphs")
    assert CUDA_COMPILE["O0"] is None and device.compile_options("O2") is CUDA_COMPILE["O2"]


def test_cuda_space_drops_power_with_reason(monkeypatch):
    # An A100's capabilities, without the GPU: every precision stays, bf16 first.
    monkeypatch.setattr(CudaDevice, "capabilities", lambda self: cuda_capabilities("A100", (8, 0)))
    space = CudaBackend().adapt_space(load_space())
    assert space.dimension("dtype").values == ("bf16", "fp16", "fp32")
    assert "device_power" not in {d.name for d in space.dimensions}
    assert "nvidia-smi" in space.dropped["device_power"]
    assert space.dimension("quant").values == load_space().dimension("quant").values


def test_cuda_int4_uses_the_tinygemm_layout():
    assert CudaDevice().quantizer("w4a16").config().int4_packing_format == "tile_packed_to_4d"


def test_cuda_quantizers_per_scheme():
    device = CudaDevice()
    assert type(device.quantizer("w8a8")) is CudaW8A8  # rows padded for cuBLAS's int8 GEMM
    assert type(device.quantizer("w4a16")) is CudaW4A16  # a group size per layer, tinygemm's layout
    assert type(device.quantizer("w8a16")) is W8A16 and type(device.quantizer("none")) is Baseline
    assert set(CUDA_QUANTIZERS) == set(QUANT_SCHEMES)


def test_int8_rows_are_padded_past_16():
    for rows in (1, 8, 16):
        assert pad_rows(torch.ones(rows, 4)).shape == (INT_MM_MIN_ROWS, 4) and INT_MM_MIN_ROWS > 16
        assert pad_rows(torch.ones(rows, 4))[rows:].abs().sum() == 0
    x = torch.ones(40, 4)
    assert pad_rows(x) is x


@pytest.mark.parametrize("lead", [(8,), (2, 3), (1, 17)])
def test_row_padded_int8_linear_computes_what_the_unpadded_one_does(lead):
    """Decode (8 rows), a short prefill (2 x 3) and a long one, through torchao's dynamic int8 linear on this CPU:
    the inner linear always sees more than 16 rows and the padding changes no real row (per-token scales)."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    torch.manual_seed(0)
    holder = nn.ModuleDict({"linear": nn.Linear(64, 32, bias=False)})
    quantize_(holder, Int8DynamicActivationInt8WeightConfig())
    padded = RowPadded(holder["linear"])
    seen: list[int] = []
    padded.inner.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[0]))
    x = torch.randn(*lead, 64)
    with torch.no_grad():
        out, plain = padded(x), holder["linear"](x.reshape(-1, 64)).view(*lead, 32)
    assert out.shape == (*lead, 32) and torch.equal(out, plain)
    assert seen[0] >= INT_MM_MIN_ROWS


def test_cuda_w8a8_converts_every_layer_behind_row_padding(tiny_llama):
    """CudaW8A8 through the build's quantize step (torchao's int8 kernels run on this CPU too): every decoder linear
    layer converted and wrapped; the coverage check sees through the wrapper."""
    model = EngineModel(tiny_llama, torch.bfloat16)
    names = decoder_linear_names(model)
    coverage = quantize_layers(model, "w8a8", quantizer=CudaW8A8())
    assert coverage["converted"] == len(names) == 16
    assert all(isinstance(model.get_submodule(fqn), RowPadded) for fqn in names)


class _CpuCuda(CudaDevice):
    """The CUDA device's build path (quantizers, coverage check) with tensors on this CPU: nothing is compiled."""

    torch_device = "cpu"

    def synchronize(self) -> None:
        return None


def _fake_torchao_int4(monkeypatch) -> list[tuple[int, set[str]]]:
    """torchao's quantize_ as it treats int4 weight-only: a layer whose input width the config's group size does
    not divide is skipped with a log line only (the issue-13 finding); the others get a weight that the coverage
    check counts as converted. Returns (group size, layers converted) per call."""
    import torchao.quantization

    calls: list[tuple[int, set[str]]] = []

    def quantize_(model, config, filter_fn):
        done = set()
        for fqn, module in list(model.named_modules()):
            if filter_fn(module, fqn) and module.in_features % config.group_size == 0:
                module.weight = nn.Parameter(torch.zeros_like(module.weight, dtype=torch.int8), requires_grad=False)
                done.add(fqn)
        calls.append((config.group_size, done))

    monkeypatch.setattr(torchao.quantization, "quantize_", quantize_)
    return calls


def test_cuda_int4_build_sets_a_group_size_per_layer(monkeypatch):
    """Widths of 96 (attention, o_proj) and 256 (down_proj): groups of 32 and 128, every layer converted."""
    calls = _fake_torchao_int4(monkeypatch)
    hf = make_tiny_llama(hidden_size=96, intermediate_size=256, num_hidden_layers=2)
    engine = _CpuCuda().build(hf, DeployConfig(quant="w4a16"))
    assert sorted(size for size, _ in calls) == [32, 128]
    by_size = dict(calls)
    assert all(name.endswith("down_proj") for name in by_size[128]) and len(by_size[128]) == 2
    assert engine.quantization["converted"] == engine.quantization["decoder_linear_layers"] == 8


class _OneGroupSize(CudaW4A16):
    """The CUDA int4 path before per-width groups: one group size of 128 for every layer."""

    def apply(self, model, select):
        from torchao.quantization import quantize_

        quantize_(model, self.config(128), filter_fn=select)


def test_cuda_int4_with_fewer_layers_than_it_claims_fails_the_trial(monkeypatch):
    _fake_torchao_int4(monkeypatch)
    device = _CpuCuda()
    monkeypatch.setattr(device, "quantizer", lambda scheme: _OneGroupSize())
    hf = make_tiny_llama(hidden_size=96, intermediate_size=256, num_hidden_layers=2)
    with pytest.raises(TrialFailure, match=r"fewer layers than it claims: 6 of 8"):
        device.build(hf, DeployConfig(quant="w4a16"))


def test_accelerator_trials_do_not_limit_their_address_space():
    """RLIMIT_AS stops CUDA from starting (its driver reserves address space far beyond memory used): only a CPU
    trial sets it; on cuda and npu the parent watches resident memory (test_memory_watch.py)."""
    assert address_space_limited("cpu") and not address_space_limited("cuda") and not address_space_limited("npu")
    probe = ("import resource; from autotune.trial.child import limit_memory; "
             "before = resource.getrlimit(resource.RLIMIT_AS); limit_memory(256, {device!r}); "
             "print(before == resource.getrlimit(resource.RLIMIT_AS))")
    for device, unchanged in (("cuda", "True"), ("npu", "True"), ("cpu", "False")):
        proc = subprocess.run([sys.executable, "-c", probe.format(device=device)], capture_output=True, text=True,
                              timeout=60, check=True)
        assert proc.stdout.strip() == unchanged, (device, proc.stderr)


def test_int8_weight_packing_round_trips():
    torch.manual_seed(0)
    w = torch.randn(64, 128)
    codes, scale = quantize_weight_int8(w)
    assert codes.dtype == torch.int8 and codes.shape == (64, 128) and scale.shape == (64,)
    err = ((codes.float() * scale[:, None]) - w).abs().max()
    assert err <= scale.max() / 2 + 1e-6  # rounding error at most half a step


@pytest.mark.slow
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
