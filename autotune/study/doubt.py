"""Which trials' figures this study does not trust: those whose every timed run other processes disturbed
(autotune/contention.py). They are kept off the front (a constraint, study/loop.py) and out of everything the
search learns from its trials (the guide's fit, the trial limits' correction, the compile cost), so that one run on a
busy machine can neither set the predictions nor end the search."""
from __future__ import annotations

import optuna

__all__ = ["doubted"]


def doubted(trial: optuna.trial.FrozenTrial) -> bool:
    return bool((trial.user_attrs.get("bench") or {}).get("doubt"))
