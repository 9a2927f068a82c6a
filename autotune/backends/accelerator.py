"""What the accelerator backends share: each trial in a child process on one device kind, and the space
limited to what that device can honour."""
from __future__ import annotations

from dataclasses import replace

from autotune.backends.base import Backend
from autotune.backends.device import Device, apply_limits
from autotune.backends.isolated import run_isolated
from autotune.space import SearchSpace
from autotune.trial import Job

__all__ = ["AcceleratorBackend"]


class AcceleratorBackend(Backend):
    """A Backend whose `name` is also the device kind the child process builds and measures on
    (autotune/trial.py reads job.device). Subclasses give `device()`, `unavailable()` and `fingerprint()`."""

    def device(self) -> Device:
        raise NotImplementedError

    def adapt_space(self, space: SearchSpace) -> SearchSpace:
        return apply_limits(space, self.device().limits())

    def run(self, job: Job, timeout_s: float) -> dict:
        return run_isolated(replace(job, device=self.name), timeout_s)
