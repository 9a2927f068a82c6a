"""Run a Job in a child process with a wall-clock limit: a crash or hang costs one trial, not the study."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from collections import deque
from pathlib import Path

from autotune.trial import Job

__all__ = ["run_isolated"]


def _forward(stream, tail: deque[str]) -> None:
    for line in stream:
        line = line.rstrip("\n")
        tail.append(line)
        if line.startswith("[") and "s] " in line:  # the child's progress lines, shown live
            print(line, file=sys.stderr, flush=True)


def run_isolated(job: Job, timeout_s: float, env: dict[str, str] | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="autotune-trial-") as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(job.to_json())
        tail: deque[str] = deque(maxlen=20)
        child_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
        proc = subprocess.Popen([sys.executable, "-m", "autotune.trial", str(job_path), str(result_path)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env,
                                start_new_session=True)
        reader = threading.Thread(target=_forward, args=(proc.stdout, tail), daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            reader.join(timeout=5)
            return {"status": "error", "reason": f"timed out after {timeout_s:.0f} s", "log_tail": list(tail)}
        except BaseException:
            proc.kill()  # Ctrl-C: the child goes with the trial
            proc.wait()
            raise
        reader.join(timeout=5)
        if proc.returncode != 0 or not result_path.is_file():
            reason = (f"killed by signal {-proc.returncode}" if proc.returncode < 0
                      else f"exited with code {proc.returncode}")
            return {"status": "error", "reason": reason, "log_tail": list(tail)}
        result = json.loads(result_path.read_text())
        if result.get("status") == "error":
            result["log_tail"] = list(tail)
        return result
