"""The simulator as a guide to the order of trials: the backend's hardware profile predicts every configuration of
the space (a fraction of a second), its efficiency factors are refitted to the trials measured so far in this
study, and the next trial is taken from the predicted Pareto front of what has not been tried. It only orders:
every guided trial is built, gated and measured like any other, and the sampler (TPE) still proposes a share of
the trials, so that the search is not bound to what the model believes.

In a space over several runtimes the front is one: a configuration of OpenVINO or llama.cpp is predicted as the
engine deployment doing its arithmetic (sim/stand_in.py), with a profile of its own whose factors are fitted to
that runtime's trials alone, so that one runtime's kernels never set another's predictions. A runtime is predicted
once one of its trials has been measured here (its plain deployment is the first); until then nothing stands for
its kernels. The knobs the simulator does not see (a scheduler's token budget, a KV precision) keep their first
values in guided trials, or a variant known to pass; the local-search turns (peer_turns.py) and the sampler vary
them.

What the simulator cannot know is accuracy: numerics whose gate failed in this study are left out. Turns for speed
take schemes already known to pass (exploit); the memory turn, where lower-bit schemes are what there is to gain,
tries a scheme whose gate is not known yet, eagerly first (O0, no compile: the cheapest way to learn whether it
passes at all).

Under latency objectives (--slo) the turns are for goodput: the configurations of the predicted offline front,
each with every prefill chunk (which the offline figures do not see), are run through the simulated server
(sim/served.py: a discrete-event run of the serving scheduler over the arrival process, each step's cost from the
refitted profile), and the best predicted goodput is tried next."""
from __future__ import annotations

from collections.abc import Callable

import optuna

from autotune.config.deploy import DeployConfig
from autotune.config.runtimes import DEFAULT_RUNTIME, SHARED_KNOBS, runtime_of
from autotune.config.slo import Slo
from autotune.config.workload import Workload
from autotune.errors import AutotuneError
from autotune.models.registry import ModelSpec, resolve_model
from autotune.progress import log
from autotune.sim.anchors import CPU_METRICS
from autotune.sim.fit import CPU_FIT, MEASURED_PEAK_BOUNDS, Anchor, fit_factors, with_factors
from autotune.sim.hardware import HardwareProfile, load_profile
from autotune.sim.predict import predict
from autotune.sim.served import predict_goodput
from autotune.sim.stand_in import stand_in
from autotune.space.search_space import RUNTIME_DIMENSION, SearchSpace
from autotune.study.doubt import doubted

__all__ = ["Guide", "PROFILE_OF_BACKEND", "GUIDE_ROLE"]

# The profile that models each measured backend's hardware. A backend without one runs unguided.
PROFILE_OF_BACKEND = {"cpu": "cpu-local"}
GUIDE_ROLE = "sim-guided"
# Which objective the next guided trial is best on, in turn: throughput twice as often, as the speed gain is what
# a search is first asked for; (name, maximise).
_TURNS = (("throughput_tok_s", True), ("tpot_p99_ms", False), ("throughput_tok_s", True), ("peak_memory_mb", False))
# Under an SLO: goodput (the study's objective) three turns in four, peak memory (its other one) the fourth.
_SLO_TURNS = (("goodput_req_s", True), ("goodput_req_s", True), ("goodput_req_s", True), ("peak_memory_mb", False))
# A simulated goodput costs about 0.1 s (a rate search of simulated runs): at most this many per pick.
SERVED_CANDIDATES = 24
# Refitting every factor from scratch each trial would cost seconds; a few sweeps from the last fit suffice.
_SWEEPS = 4


def _key(params: dict) -> tuple:
    return tuple(sorted(params.items()))


def _modeled_grid(part: SearchSpace) -> list[dict]:
    """A one-runtime space's configurations over the knobs the simulator models (the shared ones and the runtime's
    MODELED), every other knob at its first value where it applies."""
    modeled = {*SHARED_KNOBS, *runtime_of(part.runtime).knob_class.MODELED}
    out: list[dict] = [{}]
    for dim in part.dimensions:
        out = [{**p, dim.name: v} for p in out for v in (
            (dim.values_for(p) if dim.name in modeled else dim.values_for(p)[:1]) if dim.applies(p) else (None,))]
    return [{k: v for k, v in p.items() if v is not None} for p in out]


def _scheme(config: DeployConfig) -> tuple:
    """The runtime and its knobs that name a numerics scheme to the guide (the engine's weights and precision)."""
    return (config.runtime, *(getattr(config, k) for k in config.knobs.SCHEME))


def _variant(config: DeployConfig) -> dict:
    """The knobs that change its numerics and the simulator does not model (how a scheme is calibrated, which
    layers fall back, a KV precision): which variant of its scheme it is."""
    knobs = config.knobs
    return {k: getattr(knobs, k) for k in knobs.NUMERICS if k not in knobs.MODELED}


class Guide:
    def __init__(self, spec: ModelSpec, space: SearchSpace, workload: Workload, profile: HardwareProfile,
                 slo: Slo | None = None) -> None:
        self.spec, self.space, self.workload, self.slo = spec, space, workload, slo
        self.prior = profile
        # Per runtime, the profile refitted to its trials; the engine's starts from the prior, the others once one
        # of their trials has been measured.
        self.profiles: dict[str, HardwareProfile] = {DEFAULT_RUNTIME: profile}
        self._fitted: dict[str, int] = {}
        # Simulated goodput per (trial parameters, what its runtime's profile was fitted to).
        self._goodput: dict[tuple, float] = {}
        grid = [{RUNTIME_DIMENSION: part.runtime, **p} for part in space.parts for p in _modeled_grid(part)] \
            if space.parts else _modeled_grid(space)
        # Precisions the profile has no rate for (an adapted space holds none), and configurations a runtime has
        # no cost view of, cannot be predicted: left out.
        self.grid = [p for p in grid if (c := stand_in(space.to_config(p))) is not None and c.dtype in profile.tflops]

    @property
    def profile(self) -> HardwareProfile:
        """The engine's profile, refitted to its trials (what trial limits are predicted with)."""
        return self.profiles[DEFAULT_RUNTIME]

    @property
    def fitted_on(self) -> int:
        """Trials the profiles were last fitted to, all runtimes together."""
        return sum(self._fitted.values())

    @classmethod
    def for_backend(cls, backend_name: str, model: str, space: SearchSpace, workload: Workload,
                    slo: Slo | None = None) -> Guide | None:
        name = PROFILE_OF_BACKEND.get(backend_name)
        if name is None:
            return None
        try:
            return cls(resolve_model(model), space, workload, load_profile(name), slo)
        except AutotuneError as exc:
            log(f"guide: the {name} profile cannot be loaded ({exc}); the sampler orders the trials alone")
            return None

    def refit(self, trials: list[optuna.trial.FrozenTrial]) -> None:
        """Fit each runtime's profile to this study's measured trials of that runtime (where there are new ones)."""
        anchors: dict[str, list[Anchor]] = {}
        for t in trials:
            bench, stored = t.user_attrs.get("bench"), t.user_attrs.get("config")
            if t.state != optuna.trial.TrialState.COMPLETE or not bench or not stored \
                    or "duplicate_of" in t.user_attrs or doubted(t):
                continue
            config = DeployConfig.from_dict(stored)
            modeled = stand_in(config)
            if modeled is None:
                continue
            anchors.setdefault(config.runtime, []).extend(
                Anchor(self.spec, modeled, self.workload, metric, float(bench[metric]), f"trial #{t.number}")
                for metric in CPU_METRICS if bench.get(metric))
        for runtime, measured in anchors.items():
            count = len({a.source for a in measured})
            if count == self._fitted.get(runtime):
                continue
            base = self.profiles.get(runtime, self.prior)
            fitted = fit_factors(base, measured, CPU_FIT, MEASURED_PEAK_BOUNDS, sweeps=_SWEEPS)
            self.profiles[runtime] = with_factors(base, fitted)
            self._fitted[runtime] = count

    def _gate_knowledge(self, trials: list[optuna.trial.FrozenTrial]) -> tuple[set[str], dict[tuple, dict], set[tuple]]:
        """(numerics keys known to fail, per scheme (_scheme) the variant (_variant) of a build known to pass (the
        defaults where they pass, else the one keeping fewest layers in the dtype), the schemes whose default
        variant failed in its first build (eager, for the engine) and of which no variant passed). A fail of the
        decode check alone counts as a fail: the guide must not propose those numerics again."""
        failing, failing_eager = set(), set()
        passing: dict[tuple, dict] = {}
        for t in trials:
            gate, stored = t.user_attrs.get("gate"), t.user_attrs.get("config")
            if not gate or not stored or "tie_aware_agreement" not in gate:
                continue
            c = DeployConfig.from_dict(stored)
            knobs, scheme = _variant(c), _scheme(c)
            if gate.get("passed"):
                best = passing.get(scheme)
                if best is None or knobs.get("fallback_layers", 0) < best.get("fallback_layers", 0):
                    passing[scheme] = knobs
            else:
                failing.add(c.numerics_key())
                default_variant = knobs == _variant(DeployConfig(runtime=c.runtime))
                if default_variant and getattr(c.knobs, "fusion_level", "O0") == "O0":
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
        turns = _TURNS if self.slo is None else _SLO_TURNS
        metric, maximise = turns[turn % len(turns)]
        explore = explore or metric == "peak_memory_mb" or not passing
        candidates: dict[tuple, tuple[dict, dict]] = {}
        last: dict[tuple, tuple[dict, dict]] = {}
        for params in self.grid:
            config = self.space.to_config(params)
            profile = self.profiles.get(config.runtime)
            scheme = _scheme(config)
            if profile is None or scheme in failing_eager or config.numerics_key() in failing:
                continue
            if scheme not in passing and not explore:
                continue
            if scheme in passing:
                params = {**params, **{k: v for k, v in passing[scheme].items() if k in params}}
            elif params.get("fusion_level", "O0") != "O0":
                # Learn the scheme's accuracy eagerly first: the same deployment at O0.
                params = {k: v for k, v in params.items() if k != "layers_per_subgraph"} | {"fusion_level": "O0"}
            config = self.space.to_config(params)
            key = _key(self.space.trial_params(params))
            if key in tried or key in candidates or key in last or (fits is not None and not fits(config)):
                continue
            modeled = stand_in(config)
            prediction = predict(self.spec, modeled, self.workload, profile)  # type: ignore[arg-type]
            if prediction.feasible:
                # Schemes the device runs only through a slow kernel (the engine's, as the probe ordered them).
                slow = config.runtime == DEFAULT_RUNTIME and f"{config.quant}@{config.dtype}" in self.space.ordered_last
                (last if slow else candidates)[key] = (params, prediction.bench())
        candidates = candidates or last
        if not candidates:
            return None
        front = _pareto(list(candidates.values()))
        names = ["throughput_tok_s", "tpot_p99_ms", "peak_memory_mb"]
        if self.slo is not None:
            front = self._served_front(candidates, front, metric, maximise)
            names.append("goodput_req_s")
        params, figures = max(front, key=lambda pf: (pf[1][metric] if maximise else -pf[1][metric],
                                                     pf[1]["throughput_tok_s"]))
        return params, {name: round(figures[name], 2) for name in names}

    def _served_front(self, candidates: dict[tuple, tuple[dict, dict]], front: list[tuple[dict, dict]],
                      metric: str, maximise: bool) -> list[tuple[dict, dict]]:
        """The front's configurations with every prefill chunk among the candidates, at most SERVED_CANDIDATES
        (the best on this turn's metric by their offline figures), each with its simulated goodput; where some meet
        the SLO at a rate, only those (a memory turn's smallest is of no use if it serves nothing)."""
        def shape(params: dict) -> tuple:
            return _key({k: v for k, v in params.items() if k != "prefill_chunk"})

        shapes = {shape(p) for p, _ in front}
        pool = [pf for pf in candidates.values() if shape(pf[0]) in shapes]
        if metric == "goodput_req_s":  # not predicted yet: the offline throughput orders them
            metric, maximise = "throughput_tok_s", True
        pool.sort(key=lambda pf: -pf[1][metric] if maximise else pf[1][metric])
        served = []
        for params, figures in pool[:SERVED_CANDIDATES]:
            config = self.space.to_config(params)
            key = (_key(params), self._fitted.get(config.runtime, 0))
            if key not in self._goodput:
                modeled = stand_in(config)
                self._goodput[key] = predict_goodput(self.spec, modeled, self.workload,  # type: ignore[arg-type]
                                                     self.profiles[config.runtime], self.slo)["goodput_req_s"]
            served.append((params, {**figures, "goodput_req_s": self._goodput[key]}))
        meeting = [pf for pf in served if pf[1]["goodput_req_s"] > 0]
        return meeting or served


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
