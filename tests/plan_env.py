"""The tiny folder model set up for a calibrated build: its own cache root, and the first 128 of the 512 calibration
samples (the flow is the same, the tiny model's passes four times shorter)."""
from __future__ import annotations

from autotune.models.registry import resolve_model
from autotune.models.weights import load_hf_model, load_tokenizer
from autotune.quant import plan as plan_module
from autotune.quant.calib_set import calibration_samples

SAMPLES = 128


def plan_env(folder, cache, monkeypatch):
    """(spec, tokenizer, fp32 model, a list that grows by one each time the calibration set is drawn)."""
    monkeypatch.setenv("AUTOTUNE_CACHE", str(cache))
    drawn: list[int] = []
    monkeypatch.setattr(plan_module, "calibration_samples",
                        lambda tok: drawn.append(1) or calibration_samples(tok)[:SAMPLES])
    spec = resolve_model(str(folder))
    return spec, load_tokenizer(spec), load_hf_model(spec, "float32"), drawn
