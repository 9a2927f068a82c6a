"""The one place a trial's gate-cache key is made: the study looks a configuration's verdict up under it before the
trial, and the trial's child (of any runtime) stores its figures under it after the gate. Both sides pass what only
they know (the device's name, the versions of the software whose kernels ran); everything else comes from the Job,
so the two keys cannot drift apart the way three hand-built ones could."""
from __future__ import annotations

from autotune.config.deploy import DeployConfig
from autotune.gate import cache
from autotune.gate.corpus import eval_set_digest
from autotune.trial.job import Job

__all__ = ["trial_gate_key"]


def trial_gate_key(job: Job, *, checksum: str, device: str, versions: dict | None = None,
                   eval_digest: str | None = None) -> str:
    """The key of `job`'s gate figures. `checksum`: the model's (models/weights.model_checksum); `device`: the
    backend's name; `versions`: the numerics software (None: torch's stack, gate/cache.numerics_versions);
    `eval_digest`: the evaluation set's, where the caller has it (default: of `job.eval_positions`)."""
    digest = eval_digest if eval_digest is not None else eval_set_digest(job.eval_positions)
    keep = tuple(job.keep) if job.keep is not None else None
    return cache.gate_key(cache.gate_inputs(
        checksum, digest, DeployConfig.from_dict(job.config), tie_epsilon=job.tie_epsilon,
        min_agreement=job.min_agreement, device=device, threads=job.threads, kept_layers=keep, versions=versions))
