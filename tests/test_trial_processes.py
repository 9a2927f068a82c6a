"""Nothing a trial started outlives it: after a normal exit, after a crash that leaves no one to clean up, and
after its parent (the study) is SIGKILLed; a grandchild in the trial's process group and one that called setsid
alike. Real subprocesses throughout."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.backends.isolated import run_isolated
from autotune.config.workload import Workload
from autotune.trial.job import Job, JobKind

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, sets Linux prctls")

# The entry: a grandchild in the trial's group, one that calls setsid (its own session and group), and one that
# calls setsid and then double-forks (a daemon: its parent exits, it is orphaned), their pids written, then `END`.
_ENTRY = """
import json, os, subprocess, sys, time
from pathlib import Path
sleep = [sys.executable, "-c", "import time; time.sleep(300)"]
grouped = subprocess.Popen(sleep)
detached = subprocess.Popen(sleep, start_new_session=True)
daemon_pid = Path({pidfile!r}).with_suffix(".daemon")
subprocess.run([sys.executable, "-c", f'''
import os, sys, time
os.setsid()
if os.fork():
    os._exit(0)
# Written whole, then renamed: the entry polls for the file and would read a half-written one.
open({{str(daemon_pid)!r}} + ".tmp", "w").write(str(os.getpid()))
os.replace({{str(daemon_pid)!r}} + ".tmp", {{str(daemon_pid)!r}})
time.sleep(300)
'''], check=True)
while not daemon_pid.exists():
    time.sleep(0.01)
pids = {{"child": os.getpid(), "grouped": grouped.pid, "detached": detached.pid,
        "daemon": int(daemon_pid.read_text())}}
Path({pidfile!r}).write_text(json.dumps(pids))
{end}
"""
_ENDS = {
    # A normal exit, with a result the parent reads.
    "exit": "from autotune.trial.job import JobResult\n"
            "open(sys.argv[2], 'w').write(json.dumps(JobResult.error('done here').to_dict()))",
    # A crash that runs no clean-up of its own (SIGKILL cannot be caught).
    "crash": "os.kill(os.getpid(), 9)",
    "hang": "time.sleep(300)",
}


def _entry(tmp_path: Path, end: str) -> tuple[dict[str, str], Path]:
    package = tmp_path / f"entry_{end}"
    package.mkdir()
    pidfile = tmp_path / f"{end}.pids"
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(_ENTRY.format(pidfile=str(pidfile), end=_ENDS[end]))
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return env, pidfile


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; it waits only for a reaper


def _survivors(pids: dict[str, int], within_s: float = 10.0) -> dict[str, int]:
    deadline = time.monotonic() + within_s
    while True:
        left = {name: pid for name, pid in pids.items() if _alive(pid)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _job() -> Job:
    return Job(kind=JobKind.TRIAL, model="m", workload=Workload().to_dict())


@pytest.mark.parametrize("end", ["exit", "crash"])
def test_nothing_the_trial_started_survives_its_end(tmp_path, end):
    env, pidfile = _entry(tmp_path, end)
    result = run_isolated(_job(), 60.0, entry=f"entry_{end}", env=env)
    assert pidfile.is_file(), f"the entry ended before it wrote its pids: {result.reason} {result.log_tail}"
    pids = json.loads(pidfile.read_text())
    assert result.reason == ("done here" if end == "exit" else "crashed: killed by SIGKILL (out of memory? killed "
                             "from outside, often by the OOM killer)")
    # Right after run_isolated returns: the group was killed before the child was reaped, and the detached ones
    # (their own session) were found by the trial's token.
    assert _survivors(pids, within_s=2.0) == {}


@pytest.mark.slow
def test_nothing_survives_a_sigkilled_parent(tmp_path):
    env, pidfile = _entry(tmp_path, "hang")
    parent = subprocess.Popen(
        [sys.executable, "-c", "import sys; from autotune.backends.isolated import run_isolated; "
         "from autotune.config.workload import Workload; from autotune.trial.job import Job, JobKind; "
         "run_isolated(Job(kind=JobKind.TRIAL, model='m', workload=Workload().to_dict()), 300.0, "
         "entry='entry_hang', env={'PYTHONPATH': sys.argv[1]})", env["PYTHONPATH"]],
        env={**os.environ, **env})
    try:
        deadline = time.monotonic() + 180  # a loaded machine starts Pythons slowly
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = json.loads(pidfile.read_text())
        assert all(_alive(pid) for pid in pids.values())
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        # PR_SET_PDEATHSIG: the child is told at once; it SIGKILLs everything below it (a subreaper, it adopted the
        # daemon when the daemon's parent exited) and exits.
        assert _survivors(pids) == {}
    finally:
        if parent.poll() is None:
            parent.kill()


@pytest.mark.slow
def test_a_timed_out_trial_takes_its_detached_grandchildren_too(tmp_path):
    env, pidfile = _entry(tmp_path, "hang")
    started = time.perf_counter()
    result = run_isolated(_job(), 30.0, entry="entry_hang", env=env)  # time for 4 Pythons to start on a busy CPU
    assert "timed out after 30 s" in (result.reason or "") and time.perf_counter() - started < 60
    assert _survivors(json.loads(pidfile.read_text()), within_s=2.0) == {}
