"""docs/how-it-works.md's tables of the decode check's pass probability are what scripts/gate_pass_probability.py
computes from the rule as it is now (autotune/gate/verdict and the design's sizes), and what its data file holds:
a change to the rule or to its sizes without the tables redone fails here. The script's vectorised looks are the
gate's own: on simulated builds they give judge's verdicts."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np

from autotune.gate.design import DECODE_MAX_PROMPTS, DECODE_NEW_TOKENS, DECODE_STAGE_PROMPTS
from autotune.gate.verdict import design_effect, judge

ROOT = Path(__file__).resolve().parents[1]


def _script():
    path = ROOT / "scripts" / "gate_pass_probability.py"
    spec = importlib.util.spec_from_file_location("gate_pass_probability", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_data_file_is_what_the_rule_gives_today():
    record = json.loads((ROOT / "docs" / "data" / "gate_pass_probability.json").read_text())
    assert record["rows"] == _script().rows()


def test_the_rule_meets_its_targets():
    """Independent positions: at most 5% of builds at 0.994 pass, at least 80% at 0.997."""
    rows = _script().rows()
    by = {r["true_agreement"]: r for r in rows if r["rho"] == 0}
    assert by[0.994]["pass_probability"] <= 0.05 and by[0.997]["pass_probability"] >= 0.80
    assert all(abs(r["pass_probability"] + r["fail_probability"] + r["marginal_probability"] - 1) < 1e-3
               for r in rows)


def test_the_scripts_looks_give_the_gates_verdicts():
    script = _script()
    scored = DECODE_NEW_TOKENS - 1
    misses = script.prompt_misses(0.996, 0.05, np.random.default_rng(7))[:60]
    verdicts, prompts = script.outcomes(misses)
    names = {script.PASS: "pass", script.FAIL: "fail", script.MARGINAL: "marginal"}
    for row, verdict, used in zip(misses, verdicts, prompts):
        for looked in range(DECODE_STAGE_PROMPTS, DECODE_MAX_PROMPTS + 1, DECODE_STAGE_PROMPTS):
            sample = row[:looked]
            positions = scored * looked
            said = judge(positions - int(sample.sum()), positions, script.THRESHOLD,
                         cap_positions=scored * DECODE_MAX_PROMPTS, effect=float(design_effect(sample, scored)))
            if said is not None:
                break
        assert (said.reason.split(":")[0], looked) == (names[verdict], used)


def test_the_docs_tables_are_the_data_file():
    record = json.loads((ROOT / "docs" / "data" / "gate_pass_probability.json").read_text())
    text = (ROOT / "docs" / "how-it-works.md").read_text()
    table = re.findall(r"^\| (0\.99\d) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|$", text, re.M)
    assert [tuple(map(float, row)) for row in table] == [
        (r["true_agreement"], r["pass_probability"], r["fail_probability"], r["marginal_probability"],
         r["expected_prompts"])
        for r in record["rows"]]
