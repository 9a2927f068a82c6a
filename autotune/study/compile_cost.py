"""What a trial's compile costs on this machine: its graphs' size in units (a decoder layer in a graph, plus one per
graph for tracing and the C++ build), times seconds per unit. Before the study has compiled at a fusion level, the
seconds per unit come from the capability probe's small inductor compile (probe/compile_time.py), scaled by a prior
ratio (PROBE_S_PER_UNIT); after, from this study's own trials at that level (their `compile_s`: dynamo's timers, and
for O2 the AOTInductor packages' own), timeouts included: a trial killed before its gate finished compiled for at
least its wall time less its loading, a lower bound that can only raise the next prediction.

O1 compiles one graph per distinct segment length (segments of equal length share one), O2 one per segment (each
has its weights frozen in), and both one for the head (engine/build.py)."""
from __future__ import annotations

from dataclasses import dataclass

import optuna

from autotune.config.deploy import DeployConfig
from autotune.study.doubt import doubted

__all__ = ["CompileEstimate", "compile_units", "compile_estimate", "PROBE_S_PER_UNIT", "FIXED_PRIOR_S",
           "TIMED_OUT_PREFIX"]

# Probe-seconds per unit before this study has compiled at a level: a prior, replaced by the study's own trials once
# one has compiled there. Measured (without a record) on a cold study of a 2-core Zen 4 EPYC when O2 was still a
# torch.compile, rounded up; O2 is now torch.export and AOTInductor packages, whose cost only the trials measure.
PROBE_S_PER_UNIT = {"O1": 0.35, "O2": 0.3}
# Where the probe has no figure (it failed, or a study made before it): one SmolLM2-sized compile per level.
FIXED_PRIOR_S = {"O0": 0.0, "O1": 300.0, "O2": 480.0}
TIMED_OUT_PREFIX = "timed out"  # backends/isolated.py's reason for a trial killed at its limit


def compile_units(config: DeployConfig, num_layers: int) -> int:
    if config.fusion_level == "O0":
        return 0
    size = min(config.layers_per_subgraph or num_layers, num_layers)
    lengths = [size] * (num_layers // size) + ([num_layers % size] if num_layers % size else [])
    graphs = sorted(set(lengths)) if config.fusion_level == "O1" else lengths
    return sum(1 + n for n in graphs) + 1


@dataclass(frozen=True, slots=True)
class CompileEstimate:
    seconds: float
    how: str


def _per_unit(trial: optuna.trial.FrozenTrial, level: str, num_layers: int, load_s: float) -> tuple[float, bool] | None:
    """(seconds per unit, whether a lower bound) that a trial at `level` measured; None where it says nothing."""
    config = trial.user_attrs.get("config") or {}
    if config.get("fusion_level") != level or doubted(trial):
        return None
    units = compile_units(DeployConfig.from_dict(config), num_layers)
    timing = trial.user_attrs.get("timing") or {}
    if timing.get("compile_s"):
        return timing["compile_s"] / units, False
    reason, wall = str(trial.user_attrs.get("reason", "")), trial.user_attrs.get("trial_seconds")
    if reason.startswith(TIMED_OUT_PREFIX) and wall and "gate_s" not in timing:
        calibration = (trial.user_attrs.get("trial_limit") or {}).get("parts", {}).get("calibration_s", 0.0)
        return max(wall - load_s - calibration, 0.0) / units, True
    return None


def compile_estimate(config: DeployConfig, num_layers: int, trials: list[optuna.trial.FrozenTrial],
                     probe_compile_s: float | None, load_s: float) -> CompileEstimate:
    """Seconds this configuration's compile is expected to take, and how that was decided."""
    level = config.fusion_level
    units = compile_units(config, num_layers)
    if not units:
        return CompileEstimate(0.0, "eager: nothing compiled")
    seen = [m for t in trials if (m := _per_unit(t, level, num_layers, load_s)) is not None]
    if seen:
        rate, bound = max(seen)
        kind = "a timed-out trial's lower bound" if bound else "the slowest measured"
        return CompileEstimate(rate * units, f"{units} units x {rate:.1f} s ({kind} of this study's {len(seen)} "
                                             f"{level} trials)")
    if probe_compile_s:
        rate = PROBE_S_PER_UNIT[level] * probe_compile_s
        return CompileEstimate(rate * units, f"{units} units x {rate:.1f} s (from the probe's {probe_compile_s:.1f} s "
                                             "compile)")
    return CompileEstimate(FIXED_PRIOR_S[level], f"a fixed prior of {FIXED_PRIOR_S[level]:.0f} s (no compile probe)")
