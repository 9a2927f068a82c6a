"""docs/how-it-works.md's table of the decode check's pass probability is what scripts/gate_pass_probability.py
computes from the rule as it is now (autotune/gate/verdict.judge and the design's sizes), and what its data file
holds: a change to the rule or to its sizes without the table redone fails here."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

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
    """At most 5% of builds at 0.994 pass, at least 80% at 0.997 (independent positions)."""
    by = {r["true_agreement"]: r for r in _script().rows()}
    assert by[0.994]["pass_probability"] <= 0.05 and by[0.997]["pass_probability"] >= 0.80
    assert all(abs(r["pass_probability"] + r["fail_probability"] + r["marginal_probability"] - 1) < 1e-3
               for r in by.values())


def test_the_docs_table_is_the_data_file():
    record = json.loads((ROOT / "docs" / "data" / "gate_pass_probability.json").read_text())
    text = (ROOT / "docs" / "how-it-works.md").read_text()
    table = re.findall(r"^\| (0\.99\d) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|$", text, re.M)
    assert [tuple(map(float, row)) for row in table] == [
        (r["true_agreement"], r["pass_probability"], r["fail_probability"], r["marginal_probability"],
         r["expected_prompts"])
        for r in record["rows"]]
