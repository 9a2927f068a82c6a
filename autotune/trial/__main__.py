"""A trial's child process: `python -m autotune.trial ENVELOPE.json RESULT.json` builds, gates and benchmarks the
envelope's job on its device (autotune/trial/child.py has the protocol)."""
from __future__ import annotations

import sys
from pathlib import Path

from autotune.devices.registry import get_device
from autotune.trial.child import Envelope, checkpoint_writer, run_child
from autotune.trial.job import JobResult
from autotune.trial.run import run_job


def _run_on_device(envelope: Envelope) -> JobResult:
    return run_job(envelope.job, get_device(envelope.device), checkpoint_writer(Path(sys.argv[2])))


if __name__ == "__main__":
    sys.exit(run_child(sys.argv[1:], _run_on_device))
