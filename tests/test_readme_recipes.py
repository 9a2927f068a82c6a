"""The study tables of the measurements page (docs/measurements.md) state what the checked-in recipes of those
studies hold: each row's throughput, gains over both speed baselines, TPOT p99, peak memory, gate figure and timed
runs, re-derived from the recipe of that study and trial (the study's database stays on the machine that ran it;
its recipes are in the repository)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from autotune.recipes.recipe import load_recipe

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "docs" / "measurements.md").read_text()
# A study table's header: its gain columns are one per speed baseline the study measured ("x bf16", "x fp32").
HEADER = re.compile(r"^\| trial \| configuration \| tok/s \|((?: x \w+ \|)+) "
                    r"TPOT p99 \| peak MB \| tie-aware \| runs \|$", re.M)


def _tables() -> list[tuple[str, list[str], list[list[str]]]]:
    """(study, gain columns' dtypes, rows) for every study table: the study is the one the command above it names."""
    out = []
    for match in HEADER.finditer(README):
        study = re.findall(r"--study (\S+)", README[:match.start()])[-1]
        dtypes = re.findall(r"x (\w+)", match.group(1))
        rows = []
        for line in README[match.end():].splitlines()[2:]:
            if not line.startswith("|"):
                break
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        out.append((study, dtypes, rows))
    return out


def _recipes() -> dict[tuple[str, int], object]:
    out = {}
    for path in (ROOT / "recipes").rglob("*.yaml"):
        recipe = load_recipe(path)
        provenance = recipe.data["provenance"]
        out[(provenance["study"], int(provenance["trial"]))] = recipe
    return out


def test_there_are_study_tables_to_check():
    assert len(_tables()) >= 1 and all(rows for _, _, rows in _tables())


@pytest.mark.parametrize("study, dtypes, rows", _tables(), ids=[study for study, _, _ in _tables()])
def test_each_row_is_what_its_recipe_holds(study, dtypes, rows):
    recipes = _recipes()
    for trial, label, tput, *cells in rows:
        gain_cells, (tpot, peak, agreement, runs) = cells[:len(dtypes)], cells[len(dtypes):]
        recipe = recipes.get((study, int(trial)))
        assert recipe is not None, f"no checked-in recipe of study {study}, trial {trial}"
        data = recipe.data
        assert recipe.config.label().startswith(label.split(" (")[0]), (trial, label, recipe.config.label())
        metrics, gains = data["metrics"], {b["dtype"]: b["throughput_gain"] for b in data["baselines"]}
        assert float(tput) == pytest.approx(metrics["throughput_tok_s"], abs=0.05), trial
        for dtype, cell in zip(dtypes, gain_cells):
            assert float(cell.rstrip("x")) == pytest.approx(gains[dtype], abs=0.005), (trial, dtype)
        assert float(tpot.removesuffix(" ms")) == pytest.approx(metrics["tpot_p99_ms"], abs=0.05), trial
        assert int(peak) == round(metrics["peak_memory_mb"]), trial
        assert float(agreement) == pytest.approx(data["gate"]["tie_aware_agreement"], abs=5e-5), trial
        assert int(runs) == metrics["repeats"], trial
