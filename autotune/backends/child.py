"""The child side of IsolatedBackend: `python -m autotune.backends.child ENVELOPE.json RESULT.json` runs the
in-process backend named in the envelope (the simulator) on its job, with the trial's own failure handling."""
from __future__ import annotations

import sys

from autotune.backends import get_backend
from autotune.trial.child import Envelope, run_child
from autotune.trial.job import JobResult

__all__ = ["main"]


def _run_backend(envelope: Envelope) -> JobResult:
    return get_backend(envelope.extra["backend"], envelope.extra.get("hardware")).run(envelope.job, float("inf"))


def main(argv: list[str]) -> int:
    return run_child(argv, _run_backend)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
