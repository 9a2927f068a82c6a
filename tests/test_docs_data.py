"""The README's headline figures are re-derived from the benchmark records under docs/data/ (each written by the
script that measured it, with its commit, command, machine and every round): each row's baselines, best, ratios,
order and compute-limit fraction, and the machine it names."""
from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
HEADER = ("| machine (2 cores, KVM) | `generate`, batch 8 | `generate` at the best's batch | best found | gain | limit"
          " | data |")


def _rows() -> list[tuple[str, dict]]:
    lines = README.splitlines()
    start = lines.index(HEADER) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        link = re.search(r"\(docs/data/([\w.-]+\.json)\)", line)
        assert link, f"a headline row without its data file: {line}"
        rows.append((line, json.loads((ROOT / "docs" / "data" / link.group(1)).read_text())))
    return rows


def test_the_headline_table_has_rows():
    assert _rows()


@pytest.mark.parametrize("line, record", _rows(), ids=[r["machine"]["hardware"] for _, r in _rows()])
def test_each_headline_row_is_what_its_record_holds(line, record):
    cells = [c.strip() for c in line.strip("|").split("|")]
    machine, batch8, same_batch, best, gain, limit = cells[:6]
    for key in ("commit", "command", "date", "rounds", "machine"):
        assert record[key], key
    signature = record["machine"]["cpu_signature"]
    assert f"family {signature['family']} model {signature['model']}" in machine
    assert record["machine"]["microarch"].replace("zen", "Zen ") in machine
    for name, value in (record["machine"].get("isa_caps") or {}).items():  # a run restricted to a lower ISA says so
        assert f"{name}={value}" in machine
    throughput = record["throughput"]
    first, *others = [b["label"] for b in record["baselines"]]
    assert f"{throughput[first]['median']:.1f} tok/s" in batch8
    assert record["baselines"][0]["dtype"] in batch8
    candidate = throughput["candidate"]
    assert best.startswith(record["best"]["label"].removesuffix("/power=2").removesuffix("/power=1"))
    assert best.endswith(f"{candidate['median']:.1f}")
    assert f"**{record['ratios'][first]:.2f}x**" in gain
    # Every round's figure is in the record, and the medians and ratios follow from them.
    for label, spread in throughput.items():
        rounds = [r["throughput_tok_s"] for r in record["rounds"][label]]
        assert spread["rounds"] == rounds and spread["median"] == statistics.median(rounds)
        assert spread["min"] == min(rounds) and spread["max"] == max(rounds)
    for label in [first, *others]:
        assert record["ratios"][label] == round(candidate["median"] / throughput[label]["median"], 3)
        overlap = min(candidate["rounds"]) <= max(throughput[label]["rounds"])
        assert record["order"][label] == ("within noise" if overlap else "higher")
    word = "faster" if all(record["order"][label] == "higher" for label in [first, *others]) else "within noise"
    assert gain.endswith(word)
    batched = [b for b in record["baselines"] if "@batch" in b["label"]]
    if batched:
        at = batched[0]
        assert f"batch {at['batch_size']}: {throughput[at['label']]['median']:.1f}" == same_batch
        assert f"{record['ratios'][at['label']]:.2f}x at batch {at['batch_size']}" in gain
    else:
        assert same_batch == "same batch"
    # Where the fastest precision is not the one the model loads in, the gain over it is given too.
    for fastest in (b for b in record["baselines"] if b["label"] == "fastest"):
        assert f"{record['ratios']['fastest']:.2f}x {fastest['dtype']}, the fastest" in gain
    fraction = (record["best"].get("compute_limit") or {}).get("fraction")
    assert limit == (f"{fraction:.2f}" if fraction is not None else "-")


@pytest.mark.parametrize("line, record", _rows(), ids=[r["machine"]["hardware"] for _, r in _rows()])
def test_the_search_behind_each_row_spent_its_budget_and_compiled(line, record):
    """What the issue that removed the trial cap asks of a default search, read from the record: it used at least
    90% of its budget or says why it stopped, it tried a compiled build, and no repeat cost a trial."""
    search = record["search"]
    stopped = search["stopped_by"]
    assert stopped["reason"]
    if stopped["rule"] == "time":
        assert stopped["used_s"] >= 0.9 * stopped["budget_s"]
    assert set(search["fusion_levels"]) - {"O0"}
    labels = search["trial_labels"]
    assert len(labels) == len(set(labels)) == search["trials"]
