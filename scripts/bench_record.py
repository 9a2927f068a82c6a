"""What every benchmark script writes beside its figures: a JSON record under docs/data/ with the commit, the command,
the machine (CPU model, microarchitecture, flags, ISA level and caps) and every round, so that a figure quoted in
the README or docs is re-derived from it by a test (tests/test_docs_data.py) rather than copied from a terminal.

Orders are claimed only where the rounds' ranges do not overlap (`compare`); otherwise the record says "within
noise"."""
from __future__ import annotations

import datetime
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data"


def commit() -> str:
    """The checkout's commit, with "+dirty" where the tree differs from it (the figures are then of that tree)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def machine(fingerprint: dict) -> dict:
    keep = ("hardware", "cpu", "microarch", "cpu_signature", "cores", "isa", "isa_level", "isa_flags", "isa_caps",
            "memory_gib")
    return {k: fingerprint[k] for k in keep if k in fingerprint}


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "rounds": values}


def compare(a: list[float], b: list[float]) -> str:
    """"higher", "lower" (a against b) where every round of one beats every round of the other, else "within
    noise"."""
    if min(a) > max(b):
        return "higher"
    if max(a) < min(b):
        return "lower"
    return "within noise"


def write(name: str, record: dict) -> Path:
    """docs/data/NAME.json, with the commit, the command and the date added."""
    DATA.mkdir(parents=True, exist_ok=True)
    path = DATA / f"{name}.json"
    full = {"commit": commit(), "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **record}
    path.write_text(json.dumps(full, indent=1, sort_keys=False) + "\n")
    print(f"data: {path.relative_to(ROOT)}")
    return path
