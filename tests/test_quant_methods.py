"""Calibrated quantization on a tiny random LLaMA with peaked weights: SmoothQuant's static scales are the ones
applied, AWQ's scales change (and improve) the result, a fallback keeps the named layers in bf16, and a scheme that
converts fewer layers than it claims fails."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from autotune.config.deploy import DeployConfig
from autotune.engine import build_engine
from autotune.engine.calibrated import (
    PreScaled,
    QuantPlan,
    StaticInt8Linear,
    quantize_layers,
    smoothing_factor,
    static_activation_scale,
)
from autotune.engine.int4 import Int4Linear, fake_quantize_int4
from autotune.engine.model import EngineModel
from autotune.engine.quant import Quantizer, check_coverage, decoder_linear_names, is_converted, weight_bytes
from autotune.errors import TrialFailure
from autotune.quant.awq import search_scale
from autotune.quant.sensitivity import measure_sensitivity
from autotune.quant.stats import collect_statistics, fused_weight


def _samples(vocab: int, count: int = 32, length: int = 24) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return torch.randint(3, vocab, (count, length), generator=g).tolist()


@pytest.fixture(scope="module")
def calibrated(tiny_llama):
    """(statistics, plan) of the tiny model: every layer's input statistics and AWQ scales."""
    stats = collect_statistics(tiny_llama, _samples(tiny_llama.config.vocab_size), batch_size=8)
    awq = {name: search_scale(fused_weight(tiny_llama, name), s.mean_abs, s.gram)[0] for name, s in stats.items()}
    plan = QuantPlan(act_absmax={n: s.absmax for n, s in stats.items()}, awq_scales=awq)
    return stats, plan


def _model(tiny_llama, split: int | None = None) -> EngineModel:
    return EngineModel(tiny_llama, torch.bfloat16, split)


def _layer(model: EngineModel, name: str) -> nn.Module:
    _, index, proj = name.split(".")
    layers = [layer for segment in model.segments for layer in segment.layers]
    return getattr(layers[int(index)], proj)


def test_layer_names_do_not_depend_on_the_split(tiny_llama):
    one, split = decoder_linear_names(_model(tiny_llama)), decoder_linear_names(_model(tiny_llama, 3))
    assert sorted(one.values()) == sorted(split.values())
    assert len(one) == 4 * tiny_llama.config.num_hidden_layers
    assert "segments.1.layers.0.down_proj" in split and split["segments.1.layers.0.down_proj"] == "layers.3.down_proj"


def test_statistics_match_the_inputs_they_describe(tiny_llama, calibrated):
    stats, _ = calibrated
    seen = {}
    handle = tiny_llama.model.layers[1].mlp.down_proj.register_forward_hook(
        lambda m, args, out: seen.setdefault("x", []).append(args[0].reshape(-1, args[0].shape[-1])))
    try:
        for i in range(0, 32, 8):
            tiny_llama.model(input_ids=torch.tensor(_samples(tiny_llama.config.vocab_size)[i:i + 8]))
    finally:
        handle.remove()
    x = torch.cat(seen["x"]).detach()
    layer = stats["layers.1.down_proj"]
    assert torch.allclose(layer.absmax, x.abs().amax(0))
    assert torch.allclose(layer.mean_abs, x.abs().mean(0), rtol=1e-4)
    assert torch.allclose(layer.gram, x.T @ x, rtol=1e-3, atol=1e-2)


def test_smoothquant_static_applies_the_calibrated_scales(tiny_llama, calibrated):
    _, plan = calibrated
    model = _model(tiny_llama)
    coverage = quantize_layers(model, "w8a8", "smoothquant_static", plan)
    assert coverage["converted"] == coverage["decoder_linear_layers"] == 16
    name = "layers.2.gate_up_proj"
    layer = _layer(model, name)
    assert isinstance(layer, PreScaled) and isinstance(layer.inner, StaticInt8Linear)
    weight = fused_weight(tiny_llama, name)
    factor = smoothing_factor(plan.act_absmax[name], weight)
    assert torch.allclose(layer.inv_scale.float(), 1 / factor, rtol=1e-2)
    expected = static_activation_scale(plan.act_absmax[name], 1 / layer.inv_scale.float())
    applied = layer.inner.inner.weight.act_quant_scale
    assert applied.numel() == 1 and torch.allclose(applied.float().flatten(), expected.flatten())
    # The scale is static: an input beyond the calibrated range saturates, where dynamic scaling would follow it.
    x = torch.randn(4, weight.shape[1]).bfloat16()
    small, large = layer(x).float(), layer(x * 50).float()
    reference = x.float() @ weight.T
    assert (small - reference).norm() / reference.norm() < 0.1
    assert (large / 50 - reference).norm() / reference.norm() > 0.3
    # Prefill (3-D) and decode (2-D) inputs both go through the one static scale.
    assert torch.equal(layer(x.view(2, 2, -1)).view(4, -1), layer(x))


def test_smoothquant_dynamic_migrates_the_outliers(tiny_llama, calibrated):
    _, plan = calibrated
    model = _model(tiny_llama)
    quantize_layers(model, "w8a8", "smoothquant_dynamic", plan)
    layer = _layer(model, "layers.0.qkv_proj")
    assert isinstance(layer, PreScaled) and is_converted(layer)
    assert type(layer.inner.weight).__name__ == "Int8Tensor" and layer.inner.weight.act_quant_scale is None
    assert not torch.allclose(layer.inv_scale.float(), torch.ones_like(layer.inv_scale.float()))


def test_awq_scales_change_and_improve_the_result(tiny_llama, calibrated):
    stats, plan = calibrated
    name = "layers.1.qkv_proj"
    weight, layer_stats = fused_weight(tiny_llama, name), stats[name]
    # One salient input channel: AWQ protects it; round-to-nearest (ratio 0) is the first candidate.
    mean_abs = layer_stats.mean_abs.clone()
    mean_abs[5] *= 30
    gram = layer_stats.gram.clone()
    gram[5, :] *= 30
    gram[:, 5] *= 30
    scale, figures = search_scale(weight, mean_abs, gram)
    assert figures["ratio"] > 0 and figures["loss"] < figures["rtn_loss"]
    assert scale[5] == scale.max()
    rtn, awq = _model(tiny_llama), _model(tiny_llama)
    quantize_layers(rtn, "w4a16", "rtn")
    quantize_layers(awq, "w4a16", "awq", QuantPlan(awq_scales={**plan.awq_scales, name: scale}))
    assert isinstance(_layer(rtn, name), Int4Linear)
    assert isinstance(_layer(awq, name), PreScaled) and isinstance(_layer(awq, name).inner, Int4Linear)
    x = torch.randn(64, weight.shape[1])
    x[:, 5] *= 30  # inputs with the salient channel the scales were searched for
    reference = x @ weight.T
    out_rtn, out_awq = (_layer(m, name)(x.bfloat16()).float() for m in (rtn, awq))
    assert not torch.equal(out_rtn, out_awq)
    assert (out_awq - reference).norm() < (out_rtn - reference).norm()
    # Over the calibration positions the searched scales never do worse than round-to-nearest.
    group = 64
    for layer_name, s in stats.items():
        w = fused_weight(tiny_llama, layer_name)
        err_rtn = w - fake_quantize_int4(w, group)
        a = plan.awq_scales[layer_name]
        err_awq = w - fake_quantize_int4(w * a, group) / a
        assert ((err_awq @ s.gram) * err_awq).sum() <= ((err_rtn @ s.gram) * err_rtn).sum() * (1 + 1e-5)


@pytest.mark.parametrize("scheme", ["w8a16", "w8a8", "w4a16"])
def test_fallback_keeps_the_named_layers_in_bf16(tiny_llama, scheme):
    keep = ("layers.3.down_proj", "layers.0.qkv_proj")
    model = _model(tiny_llama, 2)
    coverage = quantize_layers(model, scheme, "rtn", QuantPlan(keep=keep), fallback_layers=2)
    assert coverage["converted"] == 14 and coverage["kept"] == sorted(keep)
    for name in decoder_linear_names(model).values():
        layer = _layer(model, name)
        if name in keep:
            assert type(layer) is nn.Linear and type(layer.weight.data) is torch.Tensor
            assert layer.weight.dtype == torch.bfloat16
        else:
            assert is_converted(layer), name
    bigger = _model(tiny_llama, 2)
    quantize_layers(bigger, scheme, "rtn", QuantPlan(keep=keep[:1]), fallback_layers=1)
    assert weight_bytes(model) > weight_bytes(bigger) > weight_bytes(_quantized(tiny_llama, scheme))


def _quantized(tiny_llama, scheme: str) -> EngineModel:
    model = _model(tiny_llama)
    quantize_layers(model, scheme)
    return model


def test_fallback_without_a_plan_fails(tiny_llama):
    with pytest.raises(TrialFailure, match="fallback_layers=2"):
        build_engine(tiny_llama, DeployConfig(quant="w8a16", fallback_layers=2))
    with pytest.raises(TrialFailure, match="no calibration statistics"):
        build_engine(tiny_llama, DeployConfig(quant="w8a8", quant_method="smoothquant_static"))


class _SkipsAttention(Quantizer):
    """A quantizer that converts only the MLP, as torchao skips a layer whose width its group size does not divide."""

    weight_bits = 4

    def apply(self, model, select):
        for fqn, module in list(model.named_modules()):
            if select(module, fqn) and ("gate_up" in fqn or "down" in fqn):
                parent, _, attr = fqn.rpartition(".")
                setattr(model.get_submodule(parent), attr, Int4Linear(module))


def test_a_scheme_applied_to_fewer_layers_fails_the_trial(tiny_llama):
    model = _model(tiny_llama)
    with pytest.raises(TrialFailure, match=r"fewer layers than it claims: 8 of 16 .*qkv_proj"):
        quantize_layers(model, "w4a16", "rtn", quantizer=_SkipsAttention())


def test_torchao_int4_skipping_a_width_is_caught(tiny_llama):
    """torchao's CPU int4 config with one group size of 128 skips every 64-wide layer with a log line only."""
    from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig
    from torchao.quantization import quantize_

    model = _model(tiny_llama)
    names = decoder_linear_names(model)
    quantize_(model, PrototypeInt4WeightOnlyConfig(group_size=128, set_inductor_config=False),
              filter_fn=lambda m, fqn: fqn in names)
    converted = [fqn for fqn in names if is_converted(model.get_submodule(fqn))]
    assert converted and len(converted) < len(names)  # down_proj (128 wide) only
    with pytest.raises(TrialFailure, match="fewer layers than it claims"):
        check_coverage(model, "w4a16", names, set())


def test_cuda_int4_groups_each_layer_by_its_width():
    from autotune.devices.cuda_quant import group_sizes

    layers = {"q": nn.Linear(576, 960), "o": nn.Linear(576, 576), "down": nn.Linear(1536, 576),
              "odd": nn.Linear(96, 8)}
    assert group_sizes(layers) == {64: {"q", "o"}, 128: {"down"}, 32: {"odd"}}
    with pytest.raises(TrialFailure, match="no int4 group size"):
        group_sizes({"tiny": nn.Linear(20, 8)})


@pytest.mark.parametrize("scheme, method", [("w8a8", "smoothquant_static"), ("w8a8", "rtn")])
def test_sensitivity_ranks_the_layers_a_scheme_hurts_most(tiny_llama, calibrated, scheme, method):
    _, plan = calibrated
    samples = _samples(tiny_llama.config.vocab_size, 8)
    errors = measure_sensitivity(tiny_llama, samples, scheme, method, plan)
    assert len(errors) == 16 and all(e > 0 for e in errors.values())
    assert measure_sensitivity(tiny_llama, samples, "w8a16", "rtn", plan)["layers.0.qkv_proj"] < measure_sensitivity(
        tiny_llama, samples, "w4a16", "rtn", plan)["layers.0.qkv_proj"] / 10  # int8 weights lose far less than int4
    # Keeping the most sensitive layers in bf16 brings the model closer to the reference than keeping the least.
    ranking = sorted(errors, key=errors.get, reverse=True)
    ids = torch.tensor(_samples(tiny_llama.config.vocab_size, 4, 32))

    def distance(keep):
        config = DeployConfig(quant=scheme, quant_method=method, fallback_layers=4)
        return _logit_error(tiny_llama, build_engine(tiny_llama, config, plan=replace(plan, keep=keep)), ids)

    assert distance(tuple(ranking[:4])) < distance(tuple(ranking[-4:]))


def _logit_error(hf, engine, ids: torch.Tensor) -> float:
    runner = engine.runner(max_seq_len=ids.shape[1], max_batch=ids.shape[0])
    slots = []
    for i in range(ids.shape[0]):
        runner.cache.allocate(i, ids.shape[1])
        slots.append(runner.cache.slots(i, 0, ids.shape[1]))
    logits = engine.model.prefill(ids, torch.stack(slots), torch.full((ids.shape[0],), ids.shape[1]), all_logits=True)
    with torch.no_grad():
        reference = hf(ids).logits
    return float((torch.log_softmax(logits, -1) - torch.log_softmax(reference, -1)).abs().mean())
