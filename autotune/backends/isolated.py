"""Run a Job in a child process with a wall-clock limit and a memory limit: a crash, hang or out-of-memory costs
one trial, not the study. `IsolatedBackend` gives the same protection to a backend that runs in-process.

Nothing a trial started outlives it, however it ends: the child leads a process group, which is SIGKILLed after
every end (a normal exit and a crash too: inductor's compile workers, anything a build left behind), before the
child is reaped, so that the group's id cannot have been reused. A process that left the group (setsid) is found
by the token every process of the trial inherits in its environment. The child side (backends/launch.py) dies
with the parent and takes its descendants with it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from pathlib import Path

from autotune.backends import launch
from autotune.backends.base import Backend
from autotune.backends.launch import PARENT_ENV, TOKEN_ENV
from autotune.backends.memory_watch import MemoryWatch
from autotune.engine.compiler_cache import compiler_cache_env
from autotune.space.search_space import SearchSpace
from autotune.trial.child import Envelope, address_space_limited, partial_path
from autotune.trial.job import Job, JobResult, Status

__all__ = ["run_isolated", "IsolatedBackend", "TRIAL_ENTRY"]

TRIAL_ENTRY = "autotune.trial"
BACKEND_ENTRY = "autotune.backends.child"
LAUNCH = Path(launch.__file__).resolve()

_SIGNALS = {signal.SIGSEGV: "segmentation fault", signal.SIGBUS: "bus error", signal.SIGABRT: "aborted",
            signal.SIGILL: "illegal instruction", signal.SIGFPE: "floating-point exception"}


def _forward(stream, tail: deque[str]) -> None:
    for line in stream:
        line = line.rstrip("\n")
        tail.append(line)
        if line.startswith("[") and "s] " in line:  # the child's progress lines, shown live
            print(line, file=sys.stderr, flush=True)


def _signal_reason(returncode: int) -> str:
    sig = -returncode
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    what = _SIGNALS.get(sig, "")
    if sig == signal.SIGKILL:
        what = "out of memory? killed from outside, often by the OOM killer"
    return f"crashed: killed by {name}" + (f" ({what})" if what else "")


def _exit_reason(returncode: int, tail: deque[str], memory_limit_mb: float | None) -> str:
    if returncode < 0:
        return _signal_reason(returncode)
    text = "\n".join(tail)
    if "MemoryError" in text or "std::bad_alloc" in text or "Cannot allocate memory" in text:
        limit = f" of {memory_limit_mb:.0f} MB" if memory_limit_mb else ""
        return f"out of memory: the trial exceeded its memory limit{limit} (exited with code {returncode})"
    return f"exited with code {returncode}"


def run_isolated(job: Job, timeout_s: float, *, device: str = "cpu", memory_limit_mb: float | None = None,
                 entry: str = TRIAL_ENTRY, extra: dict | None = None, env: dict[str, str] | None = None) -> JobResult:
    """Run `job` in `python -m ENTRY` (autotune/trial/child.py's protocol) on `device`, under the limits. The
    default entry builds on the device (autotune/trial/__main__.py)."""
    with tempfile.TemporaryDirectory(prefix="autotune-trial-") as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(Envelope(job, device, memory_limit_mb, extra or {}).to_json())
        tail: deque[str] = deque(maxlen=20)
        token = uuid.uuid4().hex
        child_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                     **compiler_cache_env(), **(env or {}), TOKEN_ENV: token, PARENT_ENV: str(os.getpid())}
        child_env.pop("AUTOTUNE_STORAGE_PASSWORD", None)  # a build never needs the study's secret
        proc = subprocess.Popen([sys.executable, str(LAUNCH), entry, str(job_path), str(result_path)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env,
                                start_new_session=True)  # its own group: limited by itself (CPU), watched (else)
        reader = threading.Thread(target=_forward, args=(proc.stdout, tail), daemon=True)
        reader.start()
        # The child leads its process group: the watch counts its compile workers too.
        watch = None
        if memory_limit_mb and not address_space_limited(device):
            watch = MemoryWatch(proc.pid, memory_limit_mb).start()
        try:
            ended = _wait_unreaped(proc, timeout_s)
        except BaseException:
            _end_trial(proc, token)  # Ctrl-C or SIGTERM: the child and its compile workers go with the trial
            raise
        finally:
            if watch is not None:
                watch.stop()
        _end_trial(proc, token)
        if not ended:
            reader.join(timeout=5)
            result = JobResult.error(f"timed out after {timeout_s:g} s (the trial's wall-clock limit)", list(tail))
            return _with_partial(result, partial_path(result_path))
        reader.join(timeout=5)
        if watch is not None and watch.exceeded_mb is not None:
            return JobResult.error(f"out of memory: the trial's processes held {watch.exceeded_mb:.0f} MB of host "
                                   f"memory, past its limit of {memory_limit_mb:.0f} MB (killed)", list(tail))
        if proc.returncode != 0 or not result_path.is_file():
            return JobResult.error(_exit_reason(proc.returncode, tail, memory_limit_mb), list(tail))
        result = JobResult.from_dict(json.loads(result_path.read_text()))
        if result.status is Status.ERROR:
            result.log_tail = list(tail)
        return result


def _wait_unreaped(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait for the child to end, without reaping it (its pid, and so its group's id, stay its own until
    `_end_trial`); False when `timeout_s` passed first."""
    deadline, delay = time.monotonic() + timeout_s, 0.001
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        delay = min(delay * 2, left, 0.05)
        time.sleep(delay)
    return True


def _end_trial(proc: subprocess.Popen, token: str) -> None:
    """SIGKILL the child's whole process group (it leads one: start_new_session) and every process that carries
    the trial's token, then reap the child: inductor's compile workers and anything else it started go with it,
    so that none keeps a core busy under the next trial."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _kill_marked(token)
    proc.wait()


def _kill_marked(token: str) -> None:
    """SIGKILL every process of this user whose environment holds the trial's token (those that left the group)."""
    marker, me = f"{TOKEN_ENV}={token}".encode(), os.getpid()
    for _ in range(10):
        found = []
        for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:  # gone, or another user's
                continue
            if marker in environ.split(b"\0"):
                found.append(int(entry.name))
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def _with_partial(result: JobResult, path: Path) -> JobResult:
    """A stopped trial keeps what it had found: its gate figures (and their timing) from the child's checkpoint."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return result
    for key in ("gate", "gate_cached", "timing", "build_s"):
        if key in found:
            setattr(result, key, found[key])
    return result


class IsolatedBackend(Backend):
    """Wraps a backend that runs jobs in-process (the simulator): each job runs in a child process that calls
    the wrapped backend there (autotune/backends/child.py), under `memory_limit_mb`."""

    def __init__(self, inner: Backend, memory_limit_mb: float | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.measured = inner.measured
        self.runtime = inner.runtime
        self.memory_limit_mb = memory_limit_mb

    def unavailable(self) -> str | None:
        return self.inner.unavailable()

    def adapt_space(self, space: SearchSpace) -> SearchSpace:
        return self.inner.adapt_space(space)

    def fingerprint(self) -> dict:
        return self.inner.fingerprint()

    def run(self, job: Job, timeout_s: float) -> JobResult:
        return run_isolated(job, timeout_s, memory_limit_mb=self.memory_limit_mb, entry=BACKEND_ENTRY,
                            extra={"backend": self.inner.name, "hardware": getattr(self.inner, "hardware", None)})

    def __getattr__(self, name: str):  # profile, hardware...: what callers read from the wrapped backend
        return getattr(self.inner, name)
