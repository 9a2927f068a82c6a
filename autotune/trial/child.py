"""The protocol between an isolated job's parent and its child process: the parent writes an Envelope (the Job and
where to run it) to a file, the child runs it under the memory limit and writes a JobResult. Any failure of the
build, a MemoryError past the limit included, is written as an ERROR result with its reason; a crash that kills
the process is read by the parent from the exit status (autotune/backends/isolated.py).

Kept free of torch: a child that only predicts (the simulator) starts in a fraction of a second. The trial's own
entry point, which builds on a device, is autotune/trial/__main__.py."""
from __future__ import annotations

import json
import resource
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autotune.trial.job import Job, JobResult

__all__ = ["Envelope", "run_child", "limit_memory", "address_space_limited", "partial_path", "checkpoint_writer"]


@dataclass(slots=True)
class Envelope:
    """A job and where it runs. `extra` carries what a caller's own entry point needs (the in-process backend
    that autotune/backends/child.py runs), untouched here."""

    job: Job
    device: str = "cpu"
    memory_limit_mb: float | None = None
    extra: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "job": self.job.to_dict()})

    @classmethod
    def from_json(cls, text: str) -> Envelope:
        data = json.loads(text)
        return cls(**{**data, "job": Job(**data["job"])})


def partial_path(result_path: Path) -> Path:
    """Where a child writes what it found before it is done (a trial's gate figures): read by the parent when
    the child is stopped at its limit."""
    return result_path.with_name(result_path.stem + ".partial.json")


def checkpoint_writer(result_path: Path) -> Callable[[dict], None]:
    """A trial's checkpoint in its child process: what it found so far, written beside its result file, whole or
    absent whenever the parent reads it (autotune/backends/isolated.py, when the trial is stopped at its limit)."""
    partial = partial_path(result_path)

    def checkpoint(found: dict) -> None:
        tmp = partial.with_suffix(".tmp")
        tmp.write_text(json.dumps(found))
        tmp.replace(partial)
    return checkpoint


def address_space_limited(device: str) -> bool:
    """Whether a trial on `device` limits its own address space (RLIMIT_AS). Only on the CPU: the CUDA driver and
    torch_npu reserve address space far beyond any memory limit at start-up, so there the parent watches the
    trial's resident memory instead (autotune/backends/memory_watch.py)."""
    return device == "cpu"


def limit_memory(limit_mb: float | None, device: str = "cpu") -> None:
    """RLIMIT_AS: an allocation past the limit fails inside this process (MemoryError, failed malloc) instead of
    waking the machine's OOM killer, which might pick the worker or the database. Set here rather than in a
    preexec_fn, which is unsafe in a parent with threads (the worker's heartbeat). Nothing on an accelerator."""
    if limit_mb and address_space_limited(device):
        limit = int(limit_mb * 2**20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run_child(argv: list[str], run: Callable[[Envelope], JobResult]) -> int:
    """Read the envelope at argv[0], run it with `run`, write the result to argv[1]; always returns 0."""
    envelope = Envelope.from_json(open(argv[0]).read())
    limit_memory(envelope.memory_limit_mb, envelope.device)
    try:
        result = run(envelope)
    except MemoryError:
        traceback.print_exc()
        limit = f" of {envelope.memory_limit_mb:.0f} MB" if envelope.memory_limit_mb else ""
        result = JobResult.error(f"out of memory: the trial exceeded its memory limit{limit} (MemoryError)")
    except Exception as exc:  # noqa: BLE001 - any failure of a build is this trial's failure, with its reason
        traceback.print_exc()
        reason = f"{type(exc).__name__}: {exc}"
        if "can't allocate memory" in str(exc) or "out of memory" in str(exc).lower():
            reason = f"out of memory: {reason}"
        result = JobResult.error(reason)
    with open(argv[1], "w") as fh:
        json.dump(result.to_dict(), fh)
    return 0
