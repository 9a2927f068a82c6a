"""The front's configurations re-checked on prompts no trial saw, before their recipes are written.

Every trial's gate scores the same decode prompts, and the search keeps the fastest builds that pass: among many
builds near the threshold, the one that passed by luck on those prompts is favoured. The held-back check rebuilds
each front configuration and runs the decode check's rule on the held-back prompts (autotune/gate/corpus.py), which
took no part in any choice, and stores the verdict and figures with the study (and so with its recipe). A
configuration that fails it leaves the front, and the next configuration that the front then holds is checked in
turn. A marginal verdict or a check that could not run (its reason stored) takes it off too, unless the search ran
with --accept-marginal: then it keeps its place and its recipe says so."""
from __future__ import annotations

import time

import optuna

from autotune.backends import Backend
from autotune.config.deploy import DeployConfig
from autotune.gate.corpus import holdout_set_digest
from autotune.progress import log
from autotune.recipes.recipe import HOLDOUT_ATTR, holdout_of, holdout_verdict
from autotune.results.front import exportable, pareto_trials
from autotune.study.settings import SETUP_TIMEOUT_S
from autotune.trial.job import Job, JobKind

__all__ = ["recheck_front"]

# Each round checks the front's unchecked points; a failure can bring dominated points onto the front, which the
# next round checks. Bounded so that a machine where every build fails its held-back check still ends.
_MAX_ROUNDS = 4
# The check rebuilds the configuration (its compile included) and decodes at most 128 prompts: never more than
# the trial itself was allowed, and that much again for the rebuild.
_LIMIT_FACTOR = 2.0


def recheck_front(study: optuna.Study, backend: Backend, settings_common: dict) -> int:
    """Run the held-back check of every front point that has none yet, until the front holds no unchecked point;
    returns how many checks ran. `settings_common`: the study's model, workload, min_agreement and tie_epsilon."""
    if not backend.measured:
        return 0  # a prediction has no tokens to check
    ran = 0
    for _ in range(_MAX_ROUNDS):
        todo = [t for t in pareto_trials(study) if exportable(t) and holdout_of(study, t) is None]
        if not todo:
            break
        log(f"held-back check of {len(todo)} front configuration(s) on prompts no trial saw, before the recipes")
        for trial in todo:
            study.set_user_attr(f"{HOLDOUT_ATTR}{trial.number}", _check(trial, backend, settings_common))
            ran += 1
    return ran


def _check(trial: optuna.trial.FrozenTrial, backend: Backend, common: dict) -> dict:
    config = DeployConfig.from_dict(trial.user_attrs["config"])
    kept = (trial.user_attrs.get("quant") or {}).get("kept_layers")
    job = Job(kind=JobKind.HOLDOUT, config=config.to_dict(), threads=config.device_power,
              keep=list(kept) if kept is not None else None, **common)
    limit = (trial.user_attrs.get("trial_limit") or {}).get("seconds") or SETUP_TIMEOUT_S / _LIMIT_FACTOR
    log(f"  trial #{trial.number} {config.label()}: rebuild and decode the held-back prompts "
        f"(limit {_LIMIT_FACTOR * limit:.0f} s)")
    started = time.perf_counter()
    result = backend.run(job, _LIMIT_FACTOR * limit)
    record = {"prompts_text": holdout_set_digest(), "wall_s": round(time.perf_counter() - started, 1)}
    if result.holdout is None:
        record["reason"] = result.reason or f"the check ended {result.status.value} without figures"
        log(f"  trial #{trial.number}: held-back check not run: {record['reason']}")
        return record
    record.update(result.holdout)
    log(f"  trial #{trial.number}: held-back decode {record['decode_agreement']:.4f} over "
        f"{record['decode_positions']} positions ({holdout_verdict(record)})")
    return record
