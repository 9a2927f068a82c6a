"""What the backends of the peer runtimes (llama.cpp, OpenVINO) share: each trial and held-back job runs in a child
process through the runtime's own trial entry (config/runtimes.py), once its configuration is known to be of that
runtime; the reference and the speed baselines are transformers', run as the cpu backend runs them."""
from __future__ import annotations

from autotune.backends.base import Backend
from autotune.backends.isolated import run_isolated
from autotune.config.deploy import DeployConfig
from autotune.config.runtimes import runtime_of
from autotune.trial.job import Job, JobKind, JobResult

__all__ = ["PeerBackend"]


class PeerBackend(Backend):
    """A backend whose trials are a peer runtime's (`runtime`, its knobs and trial stages)."""

    def run(self, job: Job, timeout_s: float) -> JobResult:
        if job.kind not in (JobKind.TRIAL, JobKind.HOLDOUT):  # the reference and the speed baselines: transformers'
            return run_isolated(job, timeout_s, memory_limit_mb=self.memory_limit_mb)
        runtime = runtime_of(self.runtime)
        try:
            config = DeployConfig.from_dict(job.config)
        except (ValueError, TypeError) as exc:
            return JobResult.error(f"not a configuration of {runtime.name}: {exc}")
        if config.runtime != runtime.name:
            return JobResult.error(f"not a configuration of {runtime.name}: {config.label()} is of {config.runtime}")
        return run_isolated(job, timeout_s, memory_limit_mb=self.memory_limit_mb, entry=runtime.trial_entry)
