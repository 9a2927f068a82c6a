"""Run a Job in a child process with a wall-clock limit and a memory limit: a crash, hang or out-of-memory costs
one trial, not the study. `IsolatedBackend` gives the same protection to a backend that runs in-process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections import deque
from pathlib import Path

from autotune.backends.base import Backend
from autotune.space import SearchSpace
from autotune.trial import Job

__all__ = ["run_isolated", "IsolatedBackend"]

_SIGNALS = {signal.SIGSEGV: "segmentation fault", signal.SIGBUS: "bus error", signal.SIGABRT: "aborted",
            signal.SIGILL: "illegal instruction", signal.SIGFPE: "floating-point exception"}


def _forward(stream, tail: deque[str]) -> None:
    for line in stream:
        line = line.rstrip("\n")
        tail.append(line)
        if line.startswith("[") and "s] " in line:  # the child's progress lines, shown live
            print(line, file=sys.stderr, flush=True)


def _signal_reason(returncode: int, job: Job) -> str:
    sig = -returncode
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    what = _SIGNALS.get(sig, "")
    if sig == signal.SIGKILL:
        what = "out of memory? killed from outside, often by the OOM killer"
    return f"crashed: killed by {name}" + (f" ({what})" if what else "")


def _exit_reason(returncode: int, tail: deque[str], job: Job) -> str:
    if returncode < 0:
        return _signal_reason(returncode, job)
    text = "\n".join(tail)
    if "MemoryError" in text or "std::bad_alloc" in text or "Cannot allocate memory" in text:
        limit = f" of {job.memory_limit_mb:.0f} MB" if job.memory_limit_mb else ""
        return f"out of memory: the trial exceeded its memory limit{limit} (exited with code {returncode})"
    return f"exited with code {returncode}"


def run_isolated(job: Job, timeout_s: float, env: dict[str, str] | None = None) -> dict:
    from autotune.caches import compiler_cache_env

    with tempfile.TemporaryDirectory(prefix="autotune-trial-") as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(job.to_json())
        tail: deque[str] = deque(maxlen=20)
        child_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                     **compiler_cache_env(), **(env or {})}
        child_env.pop("AUTOTUNE_STORAGE_PASSWORD", None)  # a build never needs the study's secret
        proc = subprocess.Popen([sys.executable, "-m", "autotune.trial", str(job_path), str(result_path)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env,
                                start_new_session=True)  # the child sets its own memory limit
        reader = threading.Thread(target=_forward, args=(proc.stdout, tail), daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            reader.join(timeout=5)
            return {"status": "error", "reason": f"timed out after {timeout_s:g} s (the trial's wall-clock limit)",
                    "log_tail": list(tail)}
        except BaseException:
            proc.kill()  # Ctrl-C or SIGTERM: the child goes with the trial
            proc.wait()
            raise
        reader.join(timeout=5)
        if proc.returncode != 0 or not result_path.is_file():
            return {"status": "error", "reason": _exit_reason(proc.returncode, tail, job), "log_tail": list(tail)}
        result = json.loads(result_path.read_text())
        if result.get("status") == "error":
            result["log_tail"] = list(tail)
        return result


class IsolatedBackend(Backend):
    """Wraps a backend that runs jobs in-process (the simulator): each job runs in a child process that calls
    the wrapped backend there. `memory_limit_mb` is applied to jobs that carry no limit of their own."""

    def __init__(self, inner: Backend, memory_limit_mb: float | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.measured = inner.measured
        self.memory_limit_mb = memory_limit_mb

    def unavailable(self) -> str | None:
        return self.inner.unavailable()

    def adapt_space(self, space: SearchSpace) -> SearchSpace:
        return self.inner.adapt_space(space)

    def fingerprint(self) -> dict:
        return self.inner.fingerprint()

    def run(self, job: Job, timeout_s: float) -> dict:
        from dataclasses import replace

        child_job = replace(job, backend=self.inner.name, hardware=getattr(self.inner, "hardware", None),
                            memory_limit_mb=job.memory_limit_mb or self.memory_limit_mb)
        return run_isolated(child_job, timeout_s)

    def __getattr__(self, name: str):  # profile, hardware...: what callers read from the wrapped backend
        return getattr(self.inner, name)
