"""What the accelerator backends share: each trial in a child process on one device kind, and the space
limited to what that device can honour."""
from __future__ import annotations

from autotune.backends.base import Backend
from autotune.backends.isolated import run_isolated
from autotune.devices.base import Device, apply_limits
from autotune.probe.capabilities import Capabilities, restrict_space
from autotune.space.search_space import SearchSpace
from autotune.trial.job import Job, JobResult

__all__ = ["AcceleratorBackend"]


class AcceleratorBackend(Backend):
    """A Backend whose `name` is also the device kind the child process builds and measures on
    (the child process builds on it: autotune/trial/child.py). Subclasses give `device()`, `unavailable()` and `fingerprint()`."""

    def device(self) -> Device:
        raise NotImplementedError

    def capabilities(self) -> Capabilities | None:
        return self.device().capabilities()

    def adapt_space(self, space: SearchSpace) -> SearchSpace:
        space = apply_limits(space, self.device().limits())
        caps = self.capabilities()
        return space if caps is None else restrict_space(space, caps)

    def run(self, job: Job, timeout_s: float) -> JobResult:
        return run_isolated(job, timeout_s, device=self.name, memory_limit_mb=self.memory_limit_mb)
