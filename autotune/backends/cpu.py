"""This machine's CPU: real builds and real measurements, each trial in its own process. The space keeps the
precisions the capability probe found native (or nearly as fast), fastest first, and the thread counts the machine
has."""
from __future__ import annotations

from autotune.backends.base import Backend, restrict_to_cores
from autotune.backends.isolated import run_isolated
from autotune.host import cpu_fingerprint
from autotune.probe.capabilities import Capabilities, restrict_space
from autotune.probe.cpu import cpu_capabilities
from autotune.space.search_space import SearchSpace
from autotune.trial.job import Job, JobResult

__all__ = ["CpuBackend"]


class CpuBackend(Backend):
    name = "cpu"

    def unavailable(self) -> str | None:
        return None

    def capabilities(self) -> Capabilities:
        return cpu_capabilities()

    def adapt_space(self, space: SearchSpace) -> SearchSpace:
        space = restrict_to_cores(space, "the thread count on the CPU")
        return restrict_space(space, self.capabilities())

    def run(self, job: Job, timeout_s: float) -> JobResult:
        return run_isolated(job, timeout_s, memory_limit_mb=self.memory_limit_mb)

    def fingerprint(self) -> dict:
        return cpu_fingerprint()
