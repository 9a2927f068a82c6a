"""One contract, every backend: the same tests run against each registered backend. A backend that cannot run on
this machine is skipped with its own `unavailable()` reason, never passed. Tiny models only: seconds on a CPU."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from autotune.backends import BACKENDS
from autotune.backends.base import Backend
from autotune.config.deploy import FUSION_LEVELS, DeployConfig
from autotune.space.search_space import load_space
from autotune.trial.job import Job, Status

# Backends that model hardware they do not run on get a profile (the simulator: the card of the device check).
_HARDWARE = {"sim": "h200"}


def _make(name: str) -> Backend:
    cls = BACKENDS[name]
    return cls(_HARDWARE.get(name)) if getattr(cls, "takes_hardware", False) else cls()  # type: ignore[call-arg]


@pytest.fixture(params=sorted(BACKENDS))
def backend(request) -> Backend:
    instance = _make(request.param)
    reason = instance.unavailable()
    if reason:
        pytest.skip(f"backend {request.param!r} is absent here: {reason}")
    return instance


@pytest.fixture
def device(backend):
    """The backend's Device (placement, sync, memory, compile, quantizers); backends without one are skipped."""
    from autotune.devices.registry import DEVICES, get_device

    if not backend.measured or backend.name not in DEVICES:
        pytest.skip(f"backend {backend.name!r} places nothing on a device (it predicts)")
    return get_device(backend.name)


# ---- the Backend contract --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_adapt_space_records_every_removal(backend):
    space = load_space()
    adapted = backend.adapt_space(space)
    for dim in space.dimensions:
        names = {d.name for d in adapted.dimensions}
        if dim.name not in names:
            assert adapted.dropped.get(dim.name), f"{dim.name} dropped without a reason"
            continue
        kept = adapted.dimension(dim.name).values
        assert set(kept) <= set(dim.values), f"{dim.name} gained values"
        if set(kept) != set(dim.values):  # reordered (fastest first) is not restricted
            assert adapted.dropped.get(dim.name), f"{dim.name} restricted without a reason"
    assert adapted.grid_size() >= 1


def test_fingerprint_names_the_hardware(backend):
    fp = backend.fingerprint()
    assert isinstance(fp["hardware"], str) and fp["hardware"]
    assert "/" not in backend.hardware_name()  # used in recipe paths
    json.dumps(fp)  # stored with the study


@pytest.mark.slow
def test_bad_job_is_an_error_result_not_an_exception(backend):
    job = Job(kind="trial", model="no-such-model-anywhere", workload={}, config=DeployConfig().to_dict())
    result = backend.run(job, timeout_s=120)
    assert result.status is Status.ERROR and result.reason


# ---- the Device contract ---------------------------------------------------------------------------------------

def test_device_sync_and_peak_memory(device):
    device.synchronize()
    device.reset_peak_memory()
    size = 64 * 2**20
    block = torch.ones(size, dtype=torch.uint8, device=device.torch_device)  # touched: resident on every device
    device.synchronize()
    assert device.peak_memory_bytes() >= size
    del block


def test_compile_mapping_per_fusion_level(device):
    assert device.compile_options("O0") is None  # eager
    fused = [device.compile_options(level) for level in FUSION_LEVELS if level != "O0"]
    assert all(options is not None for options in fused)
    assert len(set(map(repr, fused))) == len(fused), "each fused level must compile differently"
    with pytest.raises(KeyError):
        device.compile_options("O9")


def _schemes(backend) -> tuple[str, ...]:
    return backend.adapt_space(load_space()).dimension("quant").values


def _stored(model: nn.Module) -> tuple[set[torch.dtype], int]:
    """The dtypes and bytes that hold a module's state, seen through tensor subclasses (torchao's quantized
    tensors keep their codes and scales as inner tensors)."""
    def leaves(t: torch.Tensor) -> list[torch.Tensor]:
        if hasattr(type(t), "__tensor_flatten__"):
            names, _ = t.__tensor_flatten__()
            return [leaf for name in names for leaf in leaves(getattr(t, name))]
        return [t]

    stored = [leaf for t in model.state_dict().values() for leaf in leaves(t)]
    return {t.dtype for t in stored}, sum(t.nbytes for t in stored)


@pytest.mark.slow
def test_quantized_linear_path_per_scheme(backend, device):
    torch.manual_seed(0)
    # 1,024 input columns: CUDA's int4 layout (tinygemm) pads the input width to a multiple of 1,024, so a
    # narrower layer measures the padding (a 128-wide one stored 2.1x its bf16 bytes on an H200), not the codes.
    layer = nn.Linear(1024, 256, bias=False, dtype=torch.bfloat16, device=device.torch_device)
    x = torch.randn(4, 1024, dtype=torch.bfloat16, device=device.torch_device)
    expected = layer(x).float()
    bf16_bytes = layer.weight.nbytes
    for scheme in _schemes(backend):
        model = nn.Sequential(nn.Linear(1024, 256, bias=False, dtype=torch.bfloat16, device=device.torch_device))
        model[0].weight = nn.Parameter(layer.weight.detach().clone(), requires_grad=False)
        quantizer = device.quantizer(scheme)
        quantizer.apply(model, lambda m, fqn: isinstance(m, nn.Linear))
        with torch.inference_mode():
            out = model(x)
        assert out.shape == (4, 256) and out.dtype == torch.bfloat16, scheme
        err = float((out.float() - expected).norm() / expected.norm())
        dtypes, nbytes = _stored(model)
        bits = quantizer.weight_bits
        if bits == 16:  # the unquantized scheme: the same weights, the same result
            assert dtypes == {torch.bfloat16} and nbytes == bf16_bytes and err == 0, scheme
            continue
        # The codes are integers, stored in about `bits` per weight (scales and zeros add a few percent: measured
        # on the CPU 4% for int8, 6% for int4); a quantizer that left bf16 weights fails here.
        assert dtypes & {torch.int8, torch.uint8, torch.int32}, f"{scheme}: stored as {dtypes}"
        assert nbytes <= 1.25 * bf16_bytes * bits / 16, f"{scheme}: {nbytes} bytes for {bf16_bytes} in bf16"
        # Round-to-nearest on `bits` bits, scaled to each channel's (or group's) range, leaves a relative error
        # near 2^-bits on these uniform weights (measured on the CPU: w8a16 0.0048, w8a8 0.0080 with its int8
        # activations, w4a16 0.068). Below the floor the weights were not rounded to `bits`; above the ceiling
        # the kernel reads them wrong.
        assert 2**-bits / 2 < err < 2**-bits * 4, f"{scheme}: relative error {err:.4f} for {bits}-bit weights"


def test_engine_runs_on_the_device(device, tiny_llama):
    from autotune.engine import Request

    engine = device.build(tiny_llama, DeployConfig(batch_size=2, page_size=16))
    assert engine.model.cos_table.device.type == torch.device(device.torch_device).type
    runner = engine.runner(max_seq_len=64)
    assert runner.cache.k_pools[0].device.type == torch.device(device.torch_device).type
    outs = runner.run([Request([1, 5, 9, 11], 6, min_new_tokens=6), Request([3, 4], 6, min_new_tokens=6)])
    assert [len(c.output_ids) for c in outs] == [6, 6]
