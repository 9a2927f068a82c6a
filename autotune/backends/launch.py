"""The first thing a trial's child process runs: `python .../autotune/backends/launch.py MODULE ARGS...` ties the
process to its parent, then runs MODULE as `python -m MODULE ARGS...` would. Run by its path, not with -m, so that
nothing of autotune is imported before MODULE (autotune.backends' __init__ loads every backend, torch with them).

Tied, on Linux: PR_SET_PDEATHSIG sends it SIGTERM when the parent (the study or worker) dies, even by SIGKILL, and
PR_SET_CHILD_SUBREAPER makes it the parent of every orphan among its descendants, so that a process that left the
group (setsid) or whose own parent exited is still found below it. On SIGTERM, and when MODULE returns, it SIGKILLs
every descendant before it exits. A descendant that escapes both (it reparents elsewhere by a daemon of its own)
still carries the trial's token in its environment, by which the parent sweeps it (backends/isolated.py).
Kept free of autotune's imports: it runs before anything else in the child."""
from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys
from pathlib import Path

__all__ = ["TOKEN_ENV", "PARENT_ENV", "descendants", "kill_descendants", "main"]

TOKEN_ENV = "AUTOTUNE_TRIAL_TOKEN"
PARENT_ENV = "AUTOTUNE_TRIAL_PARENT"
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (from /proc's parent links), nearest first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name (field 2) is in parentheses and may hold spaces: the fields after the last ")" are fixed.
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, frontier = [], [pid]
    while frontier:
        frontier = [c for p in frontier for c in children.get(p, ())]
        out += frontier
    return out


def kill_descendants(pid: int | None = None) -> int:
    """SIGKILL everything below `pid` (this process) until nothing is left, and reap what was ours; the count."""
    pid = os.getpid() if pid is None else pid
    killed = 0
    for _ in range(50):  # a process forking as fast as it is killed: give up after this many sweeps
        found = descendants(pid)
        if not found:
            break
        for child in found:
            try:
                os.kill(child, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        _reap()
    return killed


def _reap() -> None:
    while True:
        try:
            reaped, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if reaped == 0:
            return


def _tie_to_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    # The parent may have died before the prctl: then no signal comes, and the parent's pid is no longer ours.
    expected = os.environ.get(PARENT_ENV)
    if expected and os.getppid() != int(expected):
        _end(signal.SIGTERM, None)


def _end(signum: int, frame: object) -> None:
    kill_descendants()
    os._exit(128 + signum)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _end)
    _tie_to_parent()
    module, sys.argv = argv[0], [argv[0], *argv[1:]]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        kill_descendants()
    return 0


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # as `python -m` has it, not this file's folder (whose cpu.py, cuda.py... would shadow)
    sys.exit(main(sys.argv[1:]))
