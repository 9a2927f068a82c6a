"""Figures the simulator's page (docs/simulator.md) states are what the scripts it names print: the simulator
against published figures (`scripts/validate_sim.py --loo`, about a second) and, where the study it names is on
this machine, the simulator against the measured CPU trials."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "docs" / "simulator.md").read_text()  # the simulator's page, linked from the README
CPU_STUDY = ROOT / "studies" / "smollm2-135m-cpu.db"

# validate_sim.py rounds errors to whole percents (the README copies them) and medians to tenths of a percent.
PUBLISHED_POINTS = 1.0
CPU_POINTS = 0.1

_PRINTED_ROW = re.compile(r"^(\S+)\s+(\S+)\s+(\w+)\s+([\d.]+)\s+[\d.]+ \(\s*([-+]\d+)%\)\s+(?:-|[\d.]+ \(\s*([-+]\d+)%\))$")
_PRINTED_MEDIAN = re.compile(r"^median \|error\| (\w+)\s+([\d.]+)% over \d+(?:; held out\s+([\d.]+)%)?")


def _validate_sim(*args: str) -> str:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "validate_sim.py"), *args], check=True,
                          capture_output=True, text=True, timeout=600).stdout


def _readme_table(header: str) -> list[list[str]]:
    lines = README.splitlines()
    start = lines.index(header) + 2  # past the header and its |---| line
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("`") for cell in line.strip("|").split("|")])
    return rows


def _percent(cell: str) -> float | None:
    return None if cell == "-" else float(cell.rstrip("%"))


def test_published_figures_table_is_what_validate_sim_prints():
    printed, profile = {}, None
    for line in _validate_sim("--loo").splitlines():
        if line.startswith("-- "):
            profile = line.split()[1]
        elif (m := _PRINTED_ROW.match(line)) and profile:
            model, label, metric, reference, in_sample, held = m.groups()
            printed[(profile, model, label, metric)] = (float(reference), int(in_sample),
                                                        None if held is None else int(held))
    stated = {tuple(row[:4]): (float(row[4]), _percent(row[5]), _percent(row[6])) for row in _readme_table(
        "| profile | model | configuration | figure | reference | in sample | held out |")}
    assert set(stated) == set(printed), "the README's rows are not the rows the script prints"
    for key, (reference, in_sample, held) in stated.items():
        p_reference, p_in_sample, p_held = printed[key]
        assert abs(reference - p_reference) < 0.05, key
        assert abs(in_sample - p_in_sample) <= PUBLISHED_POINTS, (key, in_sample, p_in_sample)
        assert (held is None) == (p_held is None), key
        assert held is None or abs(held - p_held) <= PUBLISHED_POINTS, (key, held, p_held)
    # The prose above the table: the in-sample claim and the held-out ranges.
    for profile in ("ascend910", "a100-80g"):
        assert all(abs(v[1]) <= 1 for k, v in printed.items() if k[0] == profile), profile
    ranges = re.search(r"A100 is off by ([-+]\d+)% to ([-+]\d+)% and H100 by ([-+]\d+)% to ([-+]\d+)%",
                       " ".join(README.split()))
    assert ranges, "the README no longer states the held-out ranges"
    for profile, (low, high) in (("a100-80g", ranges.groups()[:2]), ("h100", ranges.groups()[2:])):
        held = [v[2] for k, v in printed.items() if k[0] == profile]
        assert abs(min(held) - int(low)) <= PUBLISHED_POINTS and abs(max(held) - int(high)) <= PUBLISHED_POINTS, \
            (profile, low, high, held)


@pytest.mark.skipif(not CPU_STUDY.is_file(), reason=f"{CPU_STUDY.relative_to(ROOT)} (the study the README's CPU "
                    "validation table was printed from) is not on this machine")
def test_cpu_validation_table_is_what_validate_sim_prints():
    printed = {}
    for line in _validate_sim("--cpu-storage", f"sqlite:///{CPU_STUDY}", "--loo").splitlines():
        if m := _PRINTED_MEDIAN.match(line):
            printed[m[1]] = (float(m[2]), None if m[3] is None else float(m[3]))
    metric = {"throughput": "throughput_tok_s", "TPOT p50": "tpot_p50_ms", "TTFT p50": "ttft_p50_ms",
              "peak memory": "peak_memory_mb"}
    for name, in_sample, held, _ in _readme_table("| figure | median error, in sample | held out | goal |"):
        p_in_sample, p_held = printed[metric[name]]
        assert abs(_percent(in_sample) - p_in_sample) <= CPU_POINTS, (name, in_sample, p_in_sample)
        assert abs(_percent(held) - p_held) <= CPU_POINTS, (name, held, p_held)
