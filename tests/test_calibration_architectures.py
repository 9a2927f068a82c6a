"""Calibration on every architecture the engine builds: the statistics describe the inputs the engine's fused
layers see, the fused weights are the engine's, and the sensitivity covers every layer, whether the checkpoint
keeps q/k/v and gate/up apart (LLaMA, Mistral, Qwen, Gemma) or stores them fused (Phi-3). A model whose layers
lack the modules its architecture names is refused, not calibrated on the wrong inputs."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from autotune.config.deploy import DeployConfig
from autotune.engine import build as build_module
from autotune.engine import build_engine
from autotune.engine.calibrated import QuantPlan
from autotune.engine.quant import decoder_linear_names
from autotune.models.architectures import UnsupportedModel
from autotune.quant.sensitivity import measure_sensitivity
from autotune.quant.stats import collect_statistics, fused_weight, layer_parts
from tests.model_factory import ARCHITECTURE_VARIANTS, make_tiny

LENGTH = 24


def _samples(vocab: int, count: int = 4) -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    return torch.randint(3, vocab, (count, LENGTH), generator=g).tolist()


def _engine_inputs(hf, samples: list[list[int]]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(layer name -> input [tokens, in] of the engine's fp32 linear, layer name -> its weight), from one prefill."""
    engine = build_engine(hf, DeployConfig(batch_size=len(samples), dtype="fp32"))
    names = decoder_linear_names(engine.model)
    seen: dict[str, torch.Tensor] = {}
    handles = [engine.model.get_submodule(fqn).register_forward_hook(
        lambda m, args, out, name=name: seen.__setitem__(name, args[0].reshape(-1, args[0].shape[-1])))
        for fqn, name in names.items()]
    runner = engine.runner(max_seq_len=LENGTH, max_batch=len(samples))
    for i in range(len(samples)):
        runner.cache.allocate(i, LENGTH)
    slots = torch.stack([runner.cache.slots(i, 0, LENGTH) for i in range(len(samples))])
    try:
        engine.model.prefill(torch.tensor(samples), slots, torch.full((len(samples),), LENGTH))
    finally:
        for handle in handles:
            handle.remove()
    weights = {name: engine.model.get_submodule(fqn).weight for fqn, name in names.items()}
    return seen, weights


@pytest.mark.parametrize("variant", list(ARCHITECTURE_VARIANTS))
def test_statistics_and_weights_are_those_of_the_engine_layers(variant, monkeypatch):
    # The hooks read plain nn.Linear layers; an fp32 O0 build would hold oneDNN-prepacked ones (opaque weights).
    monkeypatch.setattr(build_module, "prepack_available", lambda: False)
    hf = make_tiny(variant)
    samples = _samples(hf.config.vocab_size)
    stats = collect_statistics(hf, samples, batch_size=2)
    inputs, weights = _engine_inputs(hf, samples)
    assert set(stats) == set(inputs) and len(stats) == 4 * hf.config.num_hidden_layers
    parts = layer_parts(hf)
    for name, x in inputs.items():
        assert torch.equal(fused_weight(hf, name, parts), weights[name]), name
        torch.testing.assert_close(stats[name].absmax, x.abs().amax(0), rtol=1e-4, atol=1e-4 * float(x.abs().max()))
        assert stats[name].rows == x.shape[0]


def test_phi3_is_calibrated_on_its_fused_modules():
    hf = make_tiny("phi3")
    assert layer_parts(hf)["qkv_proj"] == ("self_attn.qkv_proj",)
    assert layer_parts(hf)["gate_up_proj"] == ("mlp.gate_up_proj",)
    assert layer_parts(make_tiny("llama"))["qkv_proj"] == ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    errors = measure_sensitivity(hf, _samples(hf.config.vocab_size), "w4a16", "rtn", QuantPlan())
    assert set(errors) == set(collect_statistics(hf, _samples(hf.config.vocab_size, 1), with_gram=False))
    assert all(e > 0 for e in errors.values())


def test_a_model_without_the_modules_its_architecture_names_is_refused():
    hf = make_tiny("llama")
    hf.model.layers[1].mlp.gate_proj = nn.Identity()
    with pytest.raises(UnsupportedModel, match=r"decoder layer 1 .* 'mlp.gate_proj'"):
        collect_statistics(hf, _samples(hf.config.vocab_size))
    with pytest.raises(UnsupportedModel, match="'mlp.gate_proj'"):
        measure_sensitivity(hf, _samples(hf.config.vocab_size), "w8a16", "rtn", QuantPlan())
