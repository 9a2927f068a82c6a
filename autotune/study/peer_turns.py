"""The guide's local-search turns for the runtimes other than the engine (OpenVINO, llama.cpp in a search over
several runtimes): from the best configuration of that runtime measured so far, one knob changed, the knobs that
keep its numerics first (their gate's teacher-forced figures are cached, and speed is what they change), then those
that change numerics, never numerics this study has seen fail the gate. The guide's own turns predict such a
runtime's weights, precision, sequences and threads with a profile fitted to its trials (study/guide.py); these
turns reach the knobs its simulator does not see (a scheduler's token budget, its KV precision)."""
from __future__ import annotations

from typing import Any

import optuna

from autotune.config.deploy import DeployConfig
from autotune.config.runtimes import DEFAULT_RUNTIME
from autotune.space.search_space import RUNTIME_DIMENSION, SearchSpace

__all__ = ["peer_runtimes", "next_peer_params", "PEER_ROLE"]

PEER_ROLE = "runtime-neighbour"


def _runtime_of(trial: optuna.trial.FrozenTrial) -> str | None:
    config = trial.user_attrs.get("config")
    return config.get("runtime", DEFAULT_RUNTIME) if config else None


def _best(trials: list[optuna.trial.FrozenTrial], runtime: str) -> optuna.trial.FrozenTrial | None:
    measured = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and "bench" in t.user_attrs
                and "duplicate_of" not in t.user_attrs and _runtime_of(t) == runtime]
    return max(measured, key=lambda t: t.user_attrs["bench"]["throughput_tok_s"], default=None)


def peer_runtimes(study: optuna.Study, space: SearchSpace) -> list[str]:
    """The space's runtimes other than the engine that have a measured configuration, fastest first."""
    trials = study.get_trials(deepcopy=False)
    best = {r: _best(trials, r) for r in space.runtimes if r != DEFAULT_RUNTIME}
    ranked = sorted((t.user_attrs["bench"]["throughput_tok_s"], r) for r, t in best.items() if t is not None)
    return [r for _, r in reversed(ranked)]


def _params(space: SearchSpace, base: dict[str, Any], changed: str, value: Any) -> dict[str, Any]:
    """`base` with `changed` set to `value`, the conditional knobs this makes apply at their first values and those
    it makes inapplicable left out (space order: a knob's conditions come before it)."""
    params: dict[str, Any] = {}
    for dim in space.dimensions:
        if not dim.applies(params):
            continue
        allowed = dim.values_for(params)
        wanted = value if dim.name == changed else base.get(dim.name)
        params[dim.name] = wanted if wanted in allowed else allowed[0]
    return params


def next_peer_params(study: optuna.Study, space: SearchSpace, runtime: str,
                     fits=None) -> dict[str, Any] | None:
    """Parameters (by dimension name) of the next trial of `runtime`: a neighbour of its best measured trial not
    tried yet, whose numerics have not failed the gate here and (`fits`) whose trial fits the time left; None when
    there is none."""
    trials = study.get_trials(deepcopy=False)
    best = _best(trials, runtime)
    if best is None:
        return None
    base = {**DeployConfig.from_dict(best.user_attrs["config"]).to_dict(), RUNTIME_DIMENSION: runtime}
    if base.get("layers_per_subgraph") == 0:
        base["layers_per_subgraph"] = "all"
    tried = {tuple(sorted((t.params or t.system_attrs.get("fixed_params", {})).items())) for t in trials}
    failing = {DeployConfig.from_dict(t.user_attrs["config"]).numerics_key() for t in trials
               if t.user_attrs.get("config") and _runtime_of(t) == runtime
               and not (t.user_attrs.get("gate") or {}).get("passed", True)}
    own = [d for d in space.dimensions if d.name != RUNTIME_DIMENSION and d.applies(base)]
    # The knobs that keep the numerics first: their trials reuse the gate's cached figures.
    for dim in sorted(own, key=lambda d: d.numerics):
        for value in dim.values_for(base):
            if value == base.get(dim.name):
                continue
            params = _params(space, base, dim.name, value)
            config = space.to_config(params)
            if tuple(sorted(space.trial_params(params).items())) in tried or config.numerics_key() in failing:
                continue
            if fits is not None and not fits(config):
                continue
            return params
    return None
