"""Which configuration the next trial is, and whether it runs: the guide's pick or the sampler's, a first build of
each compiled fusion level and of each weight-only quantization, and the time budget each must fit."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import optuna

from autotune.config.deploy import DeployConfig
from autotune.config.engine_knobs import WEIGHT_ONLY_SCHEMES
from autotune.config.runtimes import DEFAULT_RUNTIME
from autotune.progress import log
from autotune.study.coordination import NOT_RUN_ATTR, counted, fail_and_retry
from autotune.study.doubt import doubted
from autotune.study.guide import GUIDE_ROLE, Guide
from autotune.study.optuna_private import frozen_trial
from autotune.study.peer_turns import PEER_ROLE, next_peer_params, peer_runtimes

__all__ = ["GUIDED_SHARE_OF_LEFT", "MAX_MISSES", "MAX_REPEATS", "MIN_EAGER_POINTS", "FIRST_ROLE",
           "typical_trial_s", "enqueued", "over_budget", "enqueue_guided", "enqueue_first_builds", "FIRSTS"]

# A guided pick may take at most this share of the time left (or no longer than 1.5 typical trials here), so that
# one long compile cannot end the search; never more than 90% of it.
GUIDED_SHARE_OF_LEFT = 0.5
# Sampler picks in a row that would end past the budget before the search gives the rest up.
MAX_MISSES = 3
# Sampler picks in a row that repeat a measured configuration before the search takes the space as exhausted for
# the sampler (each is told its reused result, so that TPE learns it; none costs a trial).
MAX_REPEATS = 20
# Eager (O0) trials measured before a first compiled build is tried: the guide's factors are refitted to them, so
# that the compiled build it picks, and the time it is predicted to take, stand on this machine's figures.
MIN_EAGER_POINTS = 2
FIRST_ROLE = "first-build"


def typical_trial_s(study: optuna.Study) -> float:
    """1.5x the median wall time of this study's trials (0 before any)."""
    walls = [t.user_attrs["trial_seconds"] for t in study.get_trials(deepcopy=False)
             if t.user_attrs.get("trial_seconds") and not doubted(t)]
    return 1.5 * statistics.median(walls) if walls else 0.0


def enqueued(study: optuna.Study, trial: optuna.Trial) -> bool:
    """Whether the trial came from the queue (baseline, warm start, guide, retry) rather than from the sampler."""
    return "fixed_params" in frozen_trial(study, trial).system_attrs


def over_budget(study: optuna.Study, trial: optuna.Trial, config: DeployConfig, cost: float, left: float) -> bool:
    """A trial that would likely end past the budget is not run: an enqueued one (the baseline, a warm start, the
    guide's pick) is failed and queued again for the next run, which ends this one; a sampler's pick is recorded as
    not run, with the reason, and the search goes on to the next."""
    if cost <= left:
        return False
    reason = (f"not run: predicted {cost:.0f} s for {config.label()}, {max(left, 0):.0f} s left of the time budget")
    log(f"  {reason}")
    if enqueued(study, trial):
        fail_and_retry(study, trial, f"{reason}; queued again for the next run")
    else:
        trial.set_user_attr("reason", reason)
        trial.set_user_attr(NOT_RUN_ATTR, True)  # not counted in the trial budget (coordination.tally)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    return True


def _waiting(study: optuna.Study) -> bool:
    return bool(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))


def _log_pick(guide: Guide, what: str, predicted: dict, started: float) -> None:
    goodput = f"goodput {predicted['goodput_req_s']:.3g} req/s, " if "goodput_req_s" in predicted else ""
    log(f"  {what} ({guide.fitted_on} trials fitted, {time.perf_counter() - started:.1f} s): predicted {goodput}"
        f"{predicted['throughput_tok_s']:.1f} tok/s, TPOT p99 {predicted['tpot_p99_ms']:.1f} ms, "
        f"{predicted['peak_memory_mb']:.0f} MB")


def enqueue_guided(study: optuna.Study, guide: Guide, done: int, sampler_share: int,
                   fits: Callable[[DeployConfig], bool] | None, sampler_turn: bool = True) -> bool:
    """Unless a trial waits already (the baseline, warm starts, retries) or it is the sampler's turn, queue the
    guide's next configuration that `fits` the time left, with what it predicts for it. False when it was the
    guide's turn and nothing it would propose fits."""
    if _waiting(study):
        return True
    if sampler_turn and sampler_share and done % sampler_share == sampler_share - 1:
        log("  this trial is the sampler's (TPE) own")
        return True
    started = time.perf_counter()
    guided = sum(t.user_attrs.get("role") == GUIDE_ROLE for t in study.get_trials(deepcopy=False))
    if guided % PEER_SHARE == PEER_SHARE - 1 and _enqueue_peer(study, guide, fits):
        return True
    picked = guide.next_params(study, turn=guided, fits=fits)
    if picked is None:
        return fits is None or guide.next_params(study, turn=guided) is None
    params, predicted = picked
    study.enqueue_trial(guide.space.trial_params(params), user_attrs={"role": GUIDE_ROLE, "predicted": predicted})
    _log_pick(guide, "guide", predicted, started)
    return True


# In a space over several runtimes, every this-many-th guided turn is a local search around another runtime's best
# (study/peer_turns.py): it varies the knobs the simulator does not model (a scheduler's, a KV precision).
PEER_SHARE = 3


def _enqueue_peer(study: optuna.Study, guide: Guide, fits: Callable[[DeployConfig], bool] | None) -> bool:
    """Queue the next configuration of the fastest runtime but the engine that has one to try; False when none."""
    for runtime in peer_runtimes(study, guide.space) if guide.space.parts else ():
        params = next_peer_params(study, guide.space, runtime, fits)
        if params is not None:
            study.enqueue_trial(guide.space.trial_params(params), user_attrs={"role": GUIDE_ROLE,
                                                                             "picked_by": PEER_ROLE})
            log(f"  guide: {runtime}'s turn, one knob away from its best measured configuration")
            return True
    return False


# What a search tries once of each as soon as it can afford it, with the eager trials it needs measured first:
# each compiled fusion level (its compile is predicted from MIN_EAGER_POINTS eager points), and each weight-only
# quantization scheme (built eagerly, its first build is an eager point itself: the baseline's is enough). The
# guide's usual picks weigh such a build against the trials it would displace and may never choose one, though on
# some machines and models it is what wins; this is how a search learns what each is worth here.
FIRSTS: tuple[tuple[str, tuple[str, ...], int], ...] = (("fusion_level", ("O1", "O2"), MIN_EAGER_POINTS),
                                                        ("quant", WEIGHT_ONLY_SCHEMES, 1))


def _tried(trials: list[optuna.trial.FrozenTrial], knob: str) -> set[str]:
    """`knob`'s values in the trials that ran (a crash too), run or wait to (a retry stands for the one it
    replaced)."""
    return {value for t in counted(trials)
            if (value := (t.user_attrs.get("config") or {}).get(knob)
                or t.system_attrs.get("fixed_params", {}).get(knob))}


def enqueue_first_builds(study: optuna.Study, guide: Guide, cost: Callable[[DeployConfig], float],
                         left: float) -> bool:
    """Queue one build of a value of FIRSTS that the space offers and no trial has tried yet, once the eager trials
    it needs are measured: compiled fusion levels first, then weight-only schemes (not those the probe ordered last
    as too slow here), cheapest first within each: the guide's predicted best with that value among those
    predicted to end within 90% of the time left. True when one was queued."""
    names = {d.name for d in guide.space.dimensions}
    if _waiting(study) or "fusion_level" not in names:
        return False
    trials = study.get_trials(deepcopy=False)
    eager = [t for t in counted(trials) if t.state == optuna.trial.TrialState.COMPLETE
             and (t.user_attrs.get("config") or {}).get("fusion_level") == "O0"]
    started = time.perf_counter()
    for knob, values, needs in FIRSTS:
        if knob not in names or len(eager) < needs:
            continue
        tried = _tried(trials, knob)
        picks = []
        for value in guide.space.dimension(knob).values:
            if value not in values or value in tried:
                continue

            def fits(c: DeployConfig, knob=knob, value=value) -> bool:
                if c.runtime != DEFAULT_RUNTIME:  # the firsts are the engine's fusion levels and schemes
                    return False
                slow = f"{c.quant}@{c.dtype}" in guide.space.ordered_last
                return getattr(c, knob) == value and not slow and cost(c) <= 0.9 * left
            # A scheme of unknown accuracy is a candidate only when exploring: the guide then picks it at O0.
            picked = guide.next_params(study, turn=0, fits=fits, explore=knob == "quant")
            if picked is not None:
                picks.append((cost(guide.space.to_config(picked[0])), value, picked))
        if not picks:
            continue
        seconds, value, (params, predicted) = min(picks, key=lambda p: p[0])
        study.enqueue_trial(guide.space.trial_params(params), user_attrs={
            "role": FIRST_ROLE, "predicted": predicted,
            "why": f"no {value} build tried yet and one is predicted to take {seconds:.0f} s of the {left:.0f} s left"})
        _log_pick(guide, f"first {value} build, predicted {seconds:.0f} s of the {left:.0f} s left", predicted,
                  started)
        return True
    return False
