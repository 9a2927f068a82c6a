"""The memory limit of an accelerator trial: RLIMIT_AS is not set there (CUDA could not start), so the parent
watches the resident memory of the trial's process group and kills it past the limit, with the reason."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from autotune.backends.faults import FAULTS_ENV
from autotune.backends.isolated import BACKEND_ENTRY, run_isolated
from autotune.backends.memory_watch import MemoryWatch, group_rss_bytes
from autotune.config.deploy import DeployConfig
from autotune.trial.job import Job, JobKind, Status

_HOLD = "import time; hoard = bytearray({mb} * 2**20); time.sleep(60)"  # bytearray() touches every page


def test_group_rss_counts_the_process_group():
    proc = subprocess.Popen([sys.executable, "-c", _HOLD.format(mb=64)], start_new_session=True)
    try:
        watch = MemoryWatch(proc.pid, 10_000, interval_s=0.05).start()
        for _ in range(100):  # until the child holds its 64 MB
            if group_rss_bytes(proc.pid) > 64 * 2**20:
                break
            time.sleep(0.05)
        assert group_rss_bytes(proc.pid) > 64 * 2**20
        assert group_rss_bytes(os.getpgid(0)) > 0 and watch.exceeded_mb is None  # under its limit: left alone
        watch.stop()
    finally:
        proc.kill()
        proc.wait()


def test_watch_kills_a_group_past_its_limit():
    proc = subprocess.Popen([sys.executable, "-c", _HOLD.format(mb=200)], start_new_session=True)
    watch = MemoryWatch(proc.pid, 100, interval_s=0.05).start()
    try:
        assert proc.wait(timeout=30) == -9
    finally:
        watch.stop()
        proc.kill()
    assert watch.exceeded_mb is not None and watch.exceeded_mb > 100


@pytest.mark.slow
def test_accelerator_trial_past_its_memory_fails_with_the_reason(monkeypatch, tmp_path):
    """A trial envelope for device "cuda" (its child runs the fault backend, which allocates without end): the
    child sets no RLIMIT_AS, the parent's watch stops it, and the trial fails as out of memory."""
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(FAULTS_ENV, json.dumps({"*": "oom"}))
    job = Job(kind=JobKind.TRIAL, model="llama-7b", workload={}, config=DeployConfig().to_dict())
    result = run_isolated(job, 60, device="cuda", memory_limit_mb=300, entry=BACKEND_ENTRY,
                          extra={"backend": "sim-faults", "hardware": "a100-80g"})
    assert result.status is Status.ERROR
    assert result.reason.startswith("out of memory") and "limit of 300 MB" in result.reason, result.reason

