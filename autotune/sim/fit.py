"""Fitting efficiency factors to measured figures: least squares on log errors, with a weak pull towards the
profile's stated priors so that factors the figures cannot determine stay where the priors put them."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.models.registry import ModelSpec
from autotune.sim.hardware import Factors, HardwareProfile
from autotune.sim.predict import predict

__all__ = ["Anchor", "fit_factors", "with_factors", "anchor_errors", "BOUNDS", "CPU_FIT", "MEASURED_PEAK_BOUNDS"]

# Where a fitted factor may go: efficiencies are fractions of a peak, overheads positive and below 20 ms.
BOUNDS = {
    "compute_eff": (0.02, 1.0), "bandwidth_eff": (0.02, 1.0), "workspace_mb": (1.0, 65536.0),
    "eager_launch_us": (0.1, 2e4), "graph_launch_us": (0.1, 2e4), "kernel_us": (0.05, 2e4),
    "seq_step_us": (0.1, 1e5), "quant_bw_eff.w8a16": (0.1, 1.0), "quant_bw_eff.w8a8": (0.1, 1.0),
    "quant_bw_eff.w4a16": (0.1, 1.0),
}
# cpu-local's peaks are measured, not a datasheet's (sim/microbench.py: torch's square matmul of up to 1024, a memory
# copy), and the kernels a trial runs can go past them: prefill's larger matmuls, another runtime's own kernels. Fitted
# to a goodput study's trials of SmolLM2 on a Zen 4 (scripts/validate_sim.py --goodput-storage), OpenVINO's came to
# 2.7x the measured matmul rate and 2.1x the copy's bandwidth; capped at 1, OpenVINO's predicted TTFT was 2.4x its
# measured one, and our engine's 1.2x.
MEASURED_PEAK_BOUNDS = {**BOUNDS, "compute_eff": (0.02, 4.0), "bandwidth_eff": (0.02, 4.0)}
# The CPU backend's trials vary every knob, so every factor is fitted there (pulled to its prior when the
# trials cannot tell).
CPU_FIT = ["bandwidth_eff", "compute_eff", "eager_launch_us", "kernel_us", "graph_launch_us", "seq_step_us",
           "workspace_mb", "quant_bw_eff.w8a16", "quant_bw_eff.w8a8", "quant_bw_eff.w4a16"]


@dataclass(frozen=True, slots=True)
class Anchor:
    """One measured figure: `metric` is a key of Prediction.bench() (throughput_tok_s, tpot_p50_ms, ...)."""

    spec: ModelSpec
    config: DeployConfig
    workload: Workload
    metric: str
    target: float
    source: str
    weight: float = 1.0


def with_factors(profile: HardwareProfile, values: dict[str, float]) -> HardwareProfile:
    plain = {k: v for k, v in values.items() if not k.startswith("quant_bw_eff.")}
    quant = dict(profile.factors.quant_bw_eff)
    quant.update({k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("quant_bw_eff.")})
    return replace(profile, factors=replace(profile.factors, **plain, quant_bw_eff=quant))


def _get(factors: Factors, name: str) -> float:
    if name.startswith("quant_bw_eff."):
        return factors.quant_bw_eff.get(name.split(".", 1)[1], 1.0)
    return float(getattr(factors, name))


def anchor_errors(profile: HardwareProfile, anchors: list[Anchor]) -> list[tuple[Anchor, float]]:
    """(anchor, predicted value) for each anchor."""
    return [(a, predict(a.spec, a.config, a.workload, profile).bench()[a.metric]) for a in anchors]


def _loss(profile: HardwareProfile, anchors: list[Anchor], logs: dict[str, float], priors: dict[str, float],
          pull: float) -> float:
    trial = with_factors(profile, {k: math.exp(v) for k, v in logs.items()})
    err = sum(a.weight * math.log(max(pred, 1e-12) / a.target) ** 2 for a, pred in anchor_errors(trial, anchors))
    return err + pull * sum((v - math.log(priors[k])) ** 2 for k, v in logs.items())


def fit_factors(profile: HardwareProfile, anchors: list[Anchor], names: list[str],
                bounds: dict[str, tuple[float, float]], pull: float = 1e-3, sweeps: int = 30) -> dict[str, float]:
    """Coordinate descent with golden-section steps in log space (no SciPy here); returns the fitted values."""
    priors = {n: _get(profile.factors, n) for n in names}
    logs = {n: math.log(priors[n]) for n in names}
    g = (math.sqrt(5) - 1) / 2
    for _ in range(sweeps):
        before = _loss(profile, anchors, logs, priors, pull)
        for name in names:
            lo, hi = (math.log(b) for b in bounds[name])
            a, b = lo, hi
            for _ in range(40):
                c, d = b - g * (b - a), a + g * (b - a)
                fc = _loss(profile, anchors, {**logs, name: c}, priors, pull)
                fd = _loss(profile, anchors, {**logs, name: d}, priors, pull)
                if fc < fd:
                    b = d
                else:
                    a = c
            candidate = (a + b) / 2
            if _loss(profile, anchors, {**logs, name: candidate}, priors, pull) <= _loss(
                    profile, anchors, logs, priors, pull):
                logs[name] = candidate
        if before - _loss(profile, anchors, logs, priors, pull) < 1e-10:
            break
    return {k: math.exp(v) for k, v in logs.items()}
