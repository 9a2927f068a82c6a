"""What a trial's build needs from the calibration set, computed once per model (and per scheme and method for the
sensitivity) in the trial's own process, where the fp32 model is loaded, and cached on disk for every later trial
and worker: cache_root()/quant/<model checksum>-<calibration set>-v<version>/."""
from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import os
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
from torch import nn

from autotune.config.calibration import MEASURE, SENSITIVITY_SAMPLES, calibration_inputs, needs_plan
from autotune.config.deploy import DeployConfig
from autotune.engine.calibrated import METHODS, QuantPlan
from autotune.models.registry import ModelSpec
from autotune.models.weights import model_checksum
from autotune.paths import cache_root
from autotune.progress import log
from autotune.quant.awq import search_scale
from autotune.quant.calib_set import calib_set_digest, calibration_samples, provenance
from autotune.quant.sensitivity import measure_sensitivity
from autotune.quant.stats import collect_statistics, fused_weight, layer_parts

__all__ = ["calibration", "calibration_dir", "needs_plan", "quant_plan", "sensitivity"]

# Per process, by calibration folder (model and calibration set): the samples and the calibration, read once. A
# trial builds one configuration, but quant-report and a server build many of one model.
_SAMPLES: dict[Path, list[list[int]]] = {}
_LOADED: dict[Path, dict] = {}


def calibration_dir(spec: ModelSpec) -> Path:
    """Keyed by the model and by every figure that decides what is cached here (config/calibration.py), so that
    none can be changed without a miss."""
    inputs = json.dumps([calibration_inputs(), calib_set_digest()], sort_keys=True)
    return cache_root() / "quant" / (f"{model_checksum(spec).removeprefix('sha256:')[:16]}-"
                                     f"{hashlib.sha256(inputs.encode()).hexdigest()[:16]}")


def _return_freed_memory() -> None:
    """Hand the memory a calibration or sensitivity pass freed back to the OS (glibc keeps freed heap pages
    resident), so that the trial that happened to compute them measures its deployment's memory, not theirs."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def _save(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    write(tmp)
    tmp.replace(path)  # atomic: concurrent workers never read half a file


def _samples(spec: ModelSpec, tokenizer) -> list[list[int]]:
    folder = calibration_dir(spec)
    if folder not in _SAMPLES:
        _SAMPLES[folder] = calibration_samples(tokenizer)
    return _SAMPLES[folder]


def calibration(hf_model: nn.Module, spec: ModelSpec, tokenizer) -> dict:
    """{"act_absmax", "mean_abs", "awq_scales": name -> [in], "awq": name -> search figures, "seconds"}: loaded
    from the cache, or measured (one pass of the fp32 model over the 512 samples, then AWQ's search per layer)."""
    path = calibration_dir(spec) / "calibration.pt"
    if path in _LOADED and path.is_file():
        return _LOADED[path]
    if path.is_file():
        _LOADED[path] = torch.load(path)
        return _LOADED[path]
    started = time.perf_counter()
    samples = _samples(spec, tokenizer)
    log(f"  calibration: {len(samples)} samples x {len(samples[0])} tokens through the fp32 model (once per model)")
    stats = collect_statistics(hf_model, samples)
    parts = layer_parts(hf_model)
    awq_scales, awq = {}, {}
    for name, layer in stats.items():
        assert layer.gram is not None, "collected with the Gram matrices"
        awq_scales[name], awq[name] = search_scale(fused_weight(hf_model, name, parts), layer.mean_abs, layer.gram)
        layer.gram = None
    out = {"act_absmax": {n: s.absmax for n, s in stats.items()}, "mean_abs": {n: s.mean_abs for n, s in stats.items()},
           "awq_scales": awq_scales, "awq": awq, "positions": sum(map(len, samples)),
           "seconds": time.perf_counter() - started, "provenance": provenance(samples)}
    _save(path, lambda tmp: torch.save(out, tmp))
    _LOADED[path] = out
    del stats
    _return_freed_memory()
    log(f"  calibration: done in {out['seconds']:.0f} s, cached")
    return out


def _versions() -> dict:
    out = {"torch": str(torch.__version__)}
    try:
        out["torchao"] = version("torchao")
    except PackageNotFoundError:  # the int8 schemes need it; sensitivity of the others does not
        pass
    return out


def _sensitivity_subset(samples: list[list[int]]) -> list[list[int]]:
    return samples[::max(len(samples) // SENSITIVITY_SAMPLES, 1)][:SENSITIVITY_SAMPLES]


def sensitivity(hf_model: nn.Module, spec: ModelSpec, tokenizer, scheme: str, method: str,
                calib: dict) -> list[tuple[str, float]]:
    """(layer name, relative output error) of every decoder linear layer, most sensitive first: loaded from the
    cache, or measured on every 16th calibration sample (sensitivity.py)."""
    path = calibration_dir(spec) / f"sensitivity-{scheme}-{method}.json"
    try:
        cached = json.loads(path.read_text())
        if cached["versions"] == _versions() and cached["measure"] == MEASURE:
            return [(name, err) for name, err in cached["ranking"]]
    except (OSError, ValueError, KeyError):
        pass
    started = time.perf_counter()
    subset = _sensitivity_subset(_samples(spec, tokenizer))
    log(f"  sensitivity of each decoder linear layer to {scheme}/{method}: {len(subset)} calibration samples "
        "(once per model, scheme and method)")
    plan = QuantPlan(act_absmax=calib["act_absmax"], awq_scales=calib["awq_scales"])
    errors = measure_sensitivity(hf_model, subset, scheme, method, plan)
    ranking = sorted(errors.items(), key=lambda item: -item[1])
    record = {"scheme": scheme, "method": method, "measure": MEASURE, "ranking": ranking, "samples": len(subset),
              "positions": sum(map(len, subset)), "versions": _versions(),
              "seconds": round(time.perf_counter() - started, 1)}
    _save(path, lambda tmp: tmp.write_text(json.dumps(record, indent=1)))
    _return_freed_memory()
    return ranking


def quant_plan(hf_model: nn.Module, spec: ModelSpec, tokenizer, config: DeployConfig,
               keep: tuple[str, ...] | None = None) -> QuantPlan | None:
    """The plan for `config`'s quant_method and fallback_layers; None when it needs none (round-to-nearest, no
    fallback: the build is then exactly the plain scheme). `summary` holds what the trial stores in the study:
    the calibration set's provenance, the layers kept, and the sensitivity ranking they were chosen by. `keep`
    (a recipe's kept layers, when serving it) is used as given instead of the measured ranking."""
    if not needs_plan(config):
        return None
    # Round-to-nearest with fallback needs only the sensitivity ranking (32 samples), not the statistics and AWQ's
    # search over all 512 (198 s for SmolLM2 on 2 cores, inside a trial's budget).
    # The provenance is of the samples drawn: all of them for a calibrated method, the sensitivity's subset for
    # round-to-nearest with fallback (its only use of the set).
    calib = (calibration(hf_model, spec, tokenizer) if METHODS[config.quant_method].calibrated
             else {"act_absmax": {}, "awq_scales": {}, "provenance": provenance(
                 _sensitivity_subset(_samples(spec, tokenizer)), used_for="sensitivity")})
    summary: dict = {"method": config.quant_method, "fallback_layers": config.fallback_layers,
                     "calibration": calib["provenance"]}
    if keep is not None:
        summary["kept_layers"] = list(keep)
        return QuantPlan(keep=tuple(keep), act_absmax=calib["act_absmax"], awq_scales=calib["awq_scales"],
                         summary=summary)
    keep = ()
    if config.fallback_layers:
        ranking = sensitivity(hf_model, spec, tokenizer, config.quant, config.quant_method, calib)
        keep = tuple(name for name, _ in ranking[:config.fallback_layers])
        summary["sensitivity"] = {"scheme": config.quant, "method": config.quant_method,
                                  "measure": MEASURE,
                                  "ranking": [[name, round(err, 6)] for name, err in ranking]}
    summary["kept_layers"] = list(keep)
    return QuantPlan(keep=keep, act_absmax=calib["act_absmax"], awq_scales=calib["awq_scales"], summary=summary)
