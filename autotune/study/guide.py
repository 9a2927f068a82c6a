"""The simulator as a guide to the order of trials: the backend's hardware profile predicts every configuration of
the space (a fraction of a second), its efficiency factors are refitted to the trials measured so far in this
study, and the next trial is taken from the predicted Pareto front of what has not been tried. It only orders:
every guided trial is built, gated and measured like any other, and the sampler (TPE) still proposes a share of
the trials, so that the search is not bound to what the model believes.

The simulator models autotune's engine: in a space over several runtimes the guide orders the engine's trials,
and the other runtimes' trials come from their baselines and the sampler's turns.

What the simulator cannot know is accuracy: numerics whose gate failed in this study are left out. Turns for speed
take schemes already known to pass (exploit); the memory turn, where lower-bit schemes are what there is to gain,
tries a scheme whose gate is not known yet, eagerly first (O0, no compile: the cheapest way to learn whether it
passes at all)."""
from __future__ import annotations

from collections.abc import Callable

import optuna

from autotune.config.deploy import DeployConfig
from autotune.config.runtimes import DEFAULT_RUNTIME
from autotune.config.workload import Workload
from autotune.errors import AutotuneError
from autotune.models.registry import ModelSpec, resolve_model
from autotune.progress import log
from autotune.sim.anchors import CPU_METRICS
from autotune.sim.fit import BOUNDS, CPU_FIT, Anchor, fit_factors, with_factors
from autotune.sim.hardware import HardwareProfile, load_profile
from autotune.sim.predict import predict
from autotune.space.search_space import RUNTIME_DIMENSION, SearchSpace

__all__ = ["Guide", "PROFILE_OF_BACKEND", "GUIDE_ROLE"]

# The profile that models each measured backend's hardware. A backend without one runs unguided.
PROFILE_OF_BACKEND = {"cpu": "cpu-local"}
GUIDE_ROLE = "sim-guided"
# Which objective the next guided trial is best on, in turn: throughput twice as often, as the speed gain is what
# a search is first asked for; (name, maximise).
_TURNS = (("throughput_tok_s", True), ("tpot_p99_ms", False), ("throughput_tok_s", True), ("peak_memory_mb", False))
# Refitting every factor from scratch each trial would cost seconds; a few sweeps from the last fit suffice.
_SWEEPS = 4
# The knobs the simulator models. The others (how a scheme is calibrated, which layers fall back) change accuracy
# and little else it could predict: guided trials keep them at their first value, or at a variant of the scheme
# already known to pass, and the sampler's trials explore them.
SIM_KNOBS = ("dtype", "quant", "fusion_level", "layers_per_subgraph", "batch_size", "page_size", "kv_policy",
             "device_power")
_ACCURACY_KNOBS = ("quant_method", "fallback_layers")


def _engine(config: dict | None) -> bool:
    """Whether a stored configuration is of autotune's engine, the runtime the simulator models."""
    return bool(config) and config.get("runtime", DEFAULT_RUNTIME) == DEFAULT_RUNTIME


def _key(params: dict) -> tuple:
    return tuple(sorted(params.items()))


class Guide:
    def __init__(self, spec: ModelSpec, space: SearchSpace, workload: Workload, profile: HardwareProfile) -> None:
        self.spec, self.space, self.workload = spec, space, workload
        self.prior = self.profile = profile
        engine = next((part for part in space.parts if part.runtime == DEFAULT_RUNTIME), None)
        grid = [{RUNTIME_DIMENSION: DEFAULT_RUNTIME, **p} for p in engine.grid()] if engine else (
            space.grid() if space.runtime == DEFAULT_RUNTIME else [])
        # Precisions the profile has no rate for (an adapted space holds none) cannot be predicted: left out.
        self.grid = [p for p in grid if all(
            p.get(dim.name) in (None, *dim.values_for(p)[:1]) for dim in space.dimensions
            if dim.name not in (*SIM_KNOBS, RUNTIME_DIMENSION))
            and p.get("dtype", "bf16") in profile.tflops]
        self.fitted_on = 0

    @classmethod
    def for_backend(cls, backend_name: str, model: str, space: SearchSpace, workload: Workload) -> Guide | None:
        name = PROFILE_OF_BACKEND.get(backend_name)
        if name is None:
            return None
        try:
            return cls(resolve_model(model), space, workload, load_profile(name))
        except AutotuneError as exc:
            log(f"guide: the {name} profile cannot be loaded ({exc}); the sampler orders the trials alone")
            return None

    def refit(self, trials: list[optuna.trial.FrozenTrial]) -> None:
        """Fit the profile's factors to this study's measured trials (when there are new ones)."""
        anchors = []
        for t in trials:
            bench, config = t.user_attrs.get("bench"), t.user_attrs.get("config")
            if t.state != optuna.trial.TrialState.COMPLETE or not bench or not _engine(config) \
                    or "duplicate_of" in t.user_attrs:
                continue
            anchors += [Anchor(self.spec, DeployConfig.from_dict(config), self.workload, metric, float(bench[metric]),
                               f"trial #{t.number}") for metric in CPU_METRICS if bench.get(metric)]
        measured = len({a.source for a in anchors})
        if not anchors or measured == self.fitted_on:
            return
        values = fit_factors(self.profile, anchors, CPU_FIT, BOUNDS, sweeps=_SWEEPS)
        self.profile, self.fitted_on = with_factors(self.profile, values), measured

    def _gate_knowledge(self, trials: list[optuna.trial.FrozenTrial]) -> tuple[set[str], dict[tuple, dict], set[tuple]]:
        """(numerics keys known to fail, per (scheme, dtype) the accuracy knobs of a variant known to pass (the
        defaults where they pass, else the one keeping fewest layers in the dtype), the (scheme, dtype) pairs whose
        default variant failed eagerly and of which no variant passed). A fail of the decode check alone counts as
        a fail: the guide must not propose those numerics again."""
        failing, failing_eager = set(), set()
        passing: dict[tuple, dict] = {}
        for t in trials:
            gate, config = t.user_attrs.get("gate"), t.user_attrs.get("config")
            if not gate or not _engine(config) or "tie_aware_agreement" not in gate:
                continue
            c = DeployConfig.from_dict(config)
            knobs = {k: getattr(c, k) for k in _ACCURACY_KNOBS if hasattr(c, k)}
            scheme = (c.quant, c.dtype)
            if gate.get("passed"):
                best = passing.get(scheme)
                if best is None or knobs.get("fallback_layers", 0) < best.get("fallback_layers", 0):
                    passing[scheme] = knobs
            else:
                failing.add(c.numerics_key())
                default_variant = knobs.get("quant_method", "rtn") == "rtn" and not knobs.get("fallback_layers")
                if c.fusion_level == "O0" and default_variant:
                    failing_eager.add(scheme)
        return failing, passing, failing_eager - set(passing)

    def next_params(self, study: optuna.Study, turn: int, fits: Callable[[DeployConfig], bool] | None = None,
                    explore: bool = False) -> tuple[dict, dict] | None:
        """(parameters by dimension name, predicted figures) of the next guided trial; None when the guide has
        nothing left. `fits`: whether a configuration's trial fits the time left (None: any does). `explore`:
        schemes of unknown accuracy are candidates on this turn too (as on the memory turn, or before any scheme
        passed), each at O0 first. Enqueue them as `space.trial_params(parameters)`."""
        trials = study.get_trials(deepcopy=False)
        self.refit(trials)
        # Optuna's names of the parameters (a knob chosen per scheme is named per scheme: SearchSpace.trial_params).
        tried = {_key(t.params or t.system_attrs.get("fixed_params", {})) for t in trials}
        failing, passing, failing_eager = self._gate_knowledge(trials)
        metric, maximise = _TURNS[turn % len(_TURNS)]
        explore = explore or metric == "peak_memory_mb" or not passing
        candidates: dict[tuple, tuple[dict, dict]] = {}
        last: dict[tuple, tuple[dict, dict]] = {}  # schemes the device runs only through a slow kernel
        for params in self.grid:
            config = self.space.to_config(params)
            scheme = (config.quant, config.dtype)
            if scheme in failing_eager or config.numerics_key() in failing:
                continue
            if scheme not in passing and not explore:
                continue
            if scheme in passing:
                params = {**params, **{k: v for k, v in passing[scheme].items() if k in params}}
            elif config.fusion_level != "O0":
                # Learn the scheme's accuracy eagerly first: the same deployment at O0.
                params = {k: v for k, v in params.items() if k != "layers_per_subgraph"} | {"fusion_level": "O0"}
            config = self.space.to_config(params)
            key = _key(self.space.trial_params(params))
            if key in tried or key in candidates or key in last or (fits is not None and not fits(config)):
                continue
            prediction = predict(self.spec, config, self.workload, self.profile)
            if prediction.feasible:
                slow = f"{config.quant}@{config.dtype}" in self.space.ordered_last
                (last if slow else candidates)[key] = (params, prediction.bench())
        candidates = candidates or last
        if not candidates:
            return None
        front = _pareto(list(candidates.values()))
        params, figures = max(front, key=lambda pf: (pf[1][metric] if maximise else -pf[1][metric],
                                                     pf[1]["throughput_tok_s"]))
        return params, {name: round(figures[name], 2) for name in ("throughput_tok_s", "tpot_p99_ms",
                                                                    "peak_memory_mb")}


def _pareto(points: list[tuple[dict, dict]]) -> list[tuple[dict, dict]]:
    """The non-dominated points (maximise throughput, minimise TPOT p99 and peak memory). Configurations with
    the same predicted figures are one point for this purpose, which keeps the comparison small."""
    by_figures: dict[tuple[float, float, float], tuple[dict, dict]] = {}
    for params, figures in points:
        vec = (-figures["throughput_tok_s"], figures["tpot_p99_ms"], figures["peak_memory_mb"])
        by_figures.setdefault(tuple(round(v, 6) for v in vec), (params, figures))  # type: ignore[arg-type]
    vecs = list(by_figures)
    front = [v for v in vecs if not any(all(o <= s for o, s in zip(other, v)) and other != v for other in vecs)]
    return [by_figures[v] for v in front]
