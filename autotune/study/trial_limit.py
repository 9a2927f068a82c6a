"""Each trial's wall-clock limit, from what the trial is predicted to cost on this machine: the simulator's figures
for its benchmark and gate (the backend's profile, refitted to this study's trials), compile and calibration
time as this study measured them (a prior before it has), all scaled by how far this study's finished trials ran
from their predictions. A floor keeps a quick prediction from starving a trial; a limit never comes from a fixed
figure that a slow machine's benchmark exceeds. `--trial-timeout` fixes it instead."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

import optuna

from autotune.config.deploy import DeployConfig
from autotune.config.runtimes import DEFAULT_RUNTIME
from autotune.config.workload import Workload
from autotune.gate.corpus import EVAL_POSITIONS
from autotune.gate.design import DECODE_NEW_TOKENS, DECODE_STAGE_PROMPTS
from autotune.models.registry import ModelSpec
from autotune.sim.cost import step_cost
from autotune.sim.hardware import HardwareProfile
from autotune.sim.predict import predict, step_seconds
from autotune.study.compile_cost import TIMED_OUT_PREFIX, compile_estimate
from autotune.study.doubt import doubted

__all__ = ["TrialLimit", "trial_limit", "predicted_seconds", "FLOOR_S", "FACTOR", "NO_PROFILE_S", "CEILING_S",
           "GRACE_S"]

FLOOR_S = 300.0
FACTOR = 2.5  # the limit over the (corrected) prediction: the trials' own spread and the model's error fit in it
NO_PROFILE_S = 1800.0  # a backend without a profile (CUDA, NPU) before it has measured a trial
# Past an hour a limit is at most CEILING_FACTOR x the (corrected) prediction, not FACTOR x: a prediction that is
# too high (a prior, a timeout's lower bound) wastes less on a hang, and a trial that is long (a big model on a
# slow machine) can still finish.
CEILING_S = 3600.0
CEILING_FACTOR = 1.5
# How far past the study's deadline a trial may run: one that started in time and runs a little long keeps its
# result, and none ends later than deadline + GRACE_S.
GRACE_S = 60.0
# First-time cost the simulator has no term for, until this study has measured it: a calibrated method's
# statistics and sensitivity (docs/measurements.md, "Calibrated quantization on SmolLM2").
CALIBRATION_PRIOR_S = 240.0
LOAD_S = 30.0  # process start, torch import from a cold page cache, weights
# The decode check's first stage, what a build that passes clearly spends (gate/design.py): later stages, up to the
# cap, run only for a build near the threshold, and the limit's factor covers them.
DECODE_CHECK_POSITIONS = DECODE_STAGE_PROMPTS * (DECODE_NEW_TOKENS - 1)


@dataclass(frozen=True, slots=True)
class TrialLimit:
    seconds: float
    predicted_s: float | None
    reason: str
    parts: dict[str, float] | None = None
    expected_s: float | None = None  # the prediction times this study's measured/predicted ratio

    def to_dict(self) -> dict:
        return {"seconds": round(self.seconds, 1), "predicted_s": None if self.predicted_s is None
                else round(self.predicted_s, 1), "reason": self.reason, "parts": self.parts}


def predicted_seconds(spec: ModelSpec, config: DeployConfig, workload: Workload, profile: HardwareProfile,
                      repeats: int, repeat_time_s: float, gated: bool = True) -> dict[str, float]:
    """Seconds of each part of one trial, before compile and calibration: gate (teacher-forced windows, decode
    check), benchmark (warm-up, screening wave, timed runs as benchmark/policy.py bounds them), loading."""
    pred = predict(spec, config, workload, profile)
    run_s = workload.num_requests * workload.output_tokens / max(pred.throughput_tok_s, 1e-9)
    warmup_s = 0.1 * run_s if config.fusion_level == "O0" else run_s
    timed_s = min(repeats * run_s, repeat_time_s + run_s)
    bench_s = warmup_s + 0.5 * run_s + timed_s
    # The windows are prefilled two at a time, 512 tokens each: their cost per token, as a step of the model.
    window = step_cost(spec, config.quant, config.fusion_level == "O2", 2, 512, 0.0, config.page_size, config.dtype)
    window_s, _ = step_seconds(window, spec, config, profile, 2)
    gate_s = window_s / 1024 * EVAL_POSITIONS + DECODE_CHECK_POSITIONS / config.batch_size * pred.tpot_p50_ms / 1e3
    return {"load_s": LOAD_S, "gate_s": gate_s if gated else 0.0, "bench_s": bench_s}


_SIMULATED = ("load_s", "gate_s", "bench_s")


def _correction(trials: list[optuna.trial.FrozenTrial]) -> tuple[float, int]:
    """How far this study's trials ran from the part of their prediction the simulator made (load, gate,
    benchmark), outside compiling: the median of the finished trials' ratios, raised to the largest lower bound of
    those that timed out after their gate (their wall time was at least that); 1.0 before any. Compile and
    calibration are not scaled by it: compile_cost.py estimates compiling, timeouts included."""
    ratios, bounds = [], []
    for t in trials:
        limit = t.user_attrs.get("trial_limit") or {}
        parts, wall = limit.get("parts") or {}, t.user_attrs.get("trial_seconds")
        simulated = sum(parts.get(k, 0.0) for k in _SIMULATED)
        if not wall or not simulated or not t.state.is_finished() or doubted(t):
            continue
        timing = t.user_attrs.get("timing") or {}
        compiled = timing.get("compile_s") or 0.0
        ratio = max(wall - compiled, 0.0) / simulated
        if t.state != optuna.trial.TrialState.FAIL:
            ratios.append(ratio)
        elif str(t.user_attrs.get("reason", "")).startswith(TIMED_OUT_PREFIX) and (
                "gate_s" in timing or t.user_attrs.get("config", {}).get("fusion_level") == "O0"):
            bounds.append(ratio)  # killed where the simulator's parts ran: they took at least this long
    if not ratios and not bounds:
        return 1.0, 0
    median = statistics.median(ratios) if ratios else 1.0
    return max([median, *bounds]), len(ratios) + len(bounds)


def trial_limit(spec: ModelSpec | None, config: DeployConfig, workload: Workload, profile: HardwareProfile | None,
                trials: list[optuna.trial.FrozenTrial], *, repeats: int, repeat_time_s: float,
                fixed_s: float | None = None, gated: bool = True, probe_compile_s: float | None = None,
                left_s: float | None = None) -> TrialLimit:
    """`gated` False: the gate's figures are cached and only the decode check runs (counted as the gate).
    `probe_compile_s`: the capability probe's small compile (compile_cost.py). `left_s`: seconds to the study's
    deadline; the limit is clamped to it plus GRACE_S, and kept under the ceiling (CEILING_S, CEILING_FACTOR)."""
    limit = _unclamped(spec, config, workload, profile, trials, repeats=repeats, repeat_time_s=repeat_time_s,
                       fixed_s=fixed_s, gated=gated, probe_compile_s=probe_compile_s)
    ceiling = max(CEILING_S, CEILING_FACTOR * (limit.expected_s or 0.0))
    if limit.predicted_s is not None and limit.seconds > ceiling:
        limit = replace(limit, seconds=ceiling, reason=f"the ceiling of {ceiling:.0f} s (past {CEILING_S:.0f} s, "
                                                       f"{CEILING_FACTOR}x the expected): {limit.reason}")
    if left_s is not None and limit.seconds > max(left_s, 0.0) + GRACE_S:
        clamped = max(left_s, 0.0) + GRACE_S
        limit = replace(limit, seconds=clamped, reason=f"clamped to the {max(left_s, 0.0):.0f} s left of the time "
                                                       f"budget + {GRACE_S:.0f} s grace ({limit.reason})")
    return limit


def _unclamped(spec: ModelSpec | None, config: DeployConfig, workload: Workload, profile: HardwareProfile | None,
               trials: list[optuna.trial.FrozenTrial], *, repeats: int, repeat_time_s: float,
               fixed_s: float | None, gated: bool, probe_compile_s: float | None) -> TrialLimit:
    if fixed_s:
        return TrialLimit(fixed_s, None, f"--trial-timeout {fixed_s:g} s")
    runtime = config.runtime
    if runtime != DEFAULT_RUNTIME or profile is None or spec is None or config.dtype not in profile.tflops:
        # The simulator models the engine alone: another runtime's trials are judged by that runtime's own.
        walls = [t.user_attrs["trial_seconds"] for t in trials if t.user_attrs.get("trial_seconds")
                 and (t.user_attrs.get("config") or {}).get("runtime", DEFAULT_RUNTIME) == runtime and not doubted(t)]
        whose = "" if runtime == DEFAULT_RUNTIME else f" of {runtime}"
        if not walls:
            return TrialLimit(NO_PROFILE_S, None, f"no profile models this{whose or ' backend'}: {NO_PROFILE_S:g} s "
                                                  f"until a trial{whose} has been measured")
        limit = max(FLOOR_S, FACTOR * max(walls))
        return TrialLimit(limit, None, f"{FACTOR}x the longest trial{whose} measured here ({max(walls):.0f} s)")
    parts = predicted_seconds(spec, config, workload, profile, repeats, repeat_time_s, gated)
    compiling = compile_estimate(config, spec.num_layers, trials, probe_compile_s, LOAD_S)
    parts["compile_s"] = compiling.seconds
    if config.quant_method != "rtn" or config.fallback_layers:
        parts["calibration_s"] = CALIBRATION_PRIOR_S
    correction, fitted = _correction(trials)
    simulated = sum(parts[k] for k in _SIMULATED)
    fixed = sum(v for k, v in parts.items() if k not in _SIMULATED)
    predicted = simulated + fixed
    limit = max(FLOOR_S, FACTOR * (simulated * max(correction, 1.0) + fixed))
    how = (f"{FACTOR}x the predicted {predicted:.0f} s" + (f" (load, gate and benchmark x {correction:.2f}: this "
           f"study's {fitted} trials against their predictions)" if fitted and correction > 1.0 else "")
           + f" on {profile.label}: " + ", ".join(f"{k.removesuffix('_s')} {v:.0f} s" for k, v in parts.items())
           + (f"; compile: {compiling.how}" if compiling.seconds else ""))
    reason = how if limit > FLOOR_S else f"the floor of {FLOOR_S:.0f} s ({how})"
    return TrialLimit(limit, predicted, reason, {k: round(v, 1) for k, v in parts.items()},
                      simulated * correction + fixed)
