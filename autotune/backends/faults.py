"""A test double: the simulator, except that chosen configurations crash the process that runs them. It exists
to prove that isolation, heartbeats and retries hold; it is honoured only under its own name, "sim-faults",
which no listing shows.

$AUTOTUNE_FAULTS is a JSON object from a configuration's label (DeployConfig.label(), or "*" for every trial)
to a fault: "segfault", "hang", "oom" (allocate until the memory limit stops it), "raise", or "sleep:SECONDS"
(a slow but healthy trial)."""
from __future__ import annotations

import json
import os
import time

from autotune.backends.sim import SimBackend
from autotune.config.deploy import DeployConfig
from autotune.trial.job import Job, JobKind, JobResult

__all__ = ["FaultBackend", "FAULTS_ENV"]

FAULTS_ENV = "AUTOTUNE_FAULTS"


def _fault_for(job: Job) -> str | None:
    rules = json.loads(os.environ.get(FAULTS_ENV) or "{}")
    if job.kind is not JobKind.TRIAL:
        return None
    return rules.get(DeployConfig.from_dict(job.config).label(), rules.get("*"))


def _inject(fault: str) -> None:
    print(f"fault injection: {fault}", flush=True)
    if fault == "segfault":
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV
    elif fault == "hang":
        while True:
            time.sleep(60)
    elif fault == "oom":
        hoard = []
        while True:
            hoard.append(bytearray(64 * 2**20))  # touched pages, 64 MiB at a time
    elif fault == "raise":
        raise RuntimeError("injected build failure")
    elif fault.startswith("sleep:"):
        time.sleep(float(fault.removeprefix("sleep:")))
    else:
        raise ValueError(f"unknown fault {fault!r}")


class FaultBackend(SimBackend):
    name = "sim-faults"

    def run(self, job: Job, timeout_s: float) -> JobResult:
        fault = _fault_for(job)
        if fault:
            _inject(fault)
        return super().run(job, timeout_s)
