"""Recipes: schema, checksum, tamper refusal, --force, export from a study storage, idempotent re-export."""
from __future__ import annotations

import json

import pytest
import yaml
from recipe_factory import GATE, bench, config, make_study

from autotune.cli import main
from autotune.recipes.recipe import SCHEMA_PATH, RecipeInvalid, load_recipe, recipe_checksum

FAILED_GATE = {**GATE, "tie_aware_agreement": 0.9, "passed": False}


@pytest.fixture()
def study(tmp_path, tiny_model_folder):
    points = [
        (config(batch_size=8), bench(300.0, 20.0, 500.0), GATE, {}),  # best throughput
        (config(batch_size=1), bench(90.0, 8.0, 300.0), GATE, {}),  # best latency
        (config(batch_size=2, page_size=64), bench(150.0, 12.0, 200.0), GATE, {}),  # smallest memory
        (config(batch_size=4), bench(100.0, 30.0, 600.0), GATE, {}),  # dominated
        (config(quant="w8a8", batch_size=8), bench(900.0, 1.0, 50.0), FAILED_GATE, {}),  # gated
        (config(batch_size=16), bench(950.0, 2.0, 60.0), GATE, {"memory_budget": 10.0}),  # infeasible
    ]
    return make_study(tmp_path, tiny_model_folder, tmp_path, points=points)


def _export(url: str, out) -> int:
    return main(["export", "--study", "tiny-cpu", "--storage", url, "--out", str(out)])


def test_schema_file_is_published_json_schema():
    schema = json.loads(SCHEMA_PATH.read_text())
    assert schema["$schema"].endswith("2020-12/schema") and schema["properties"]["schema_version"] == {"const": 1}


def test_export_front_and_picks_round_trip_and_is_idempotent(study, tmp_path, capsys):
    _, url = study
    out = tmp_path / "recipes"
    assert _export(url, out) == 0
    files = sorted(p for p in out.rglob("*.yaml"))
    names = {p.name for p in files}
    assert {"best-throughput.yaml", "best-latency.yaml", "smallest-memory.yaml"} <= names
    assert len(files) == 3 + 3  # three Pareto points by digest, plus the three picks
    recipes = {p.name: load_recipe(p) for p in files}
    best = recipes["best-throughput.yaml"]
    assert best.verified and best.config.batch_size == 8 and best.data["picks"] == ["best-throughput"]
    assert best.data["baseline"]["throughput_gain"] == pytest.approx(3.0)
    assert recipes["best-latency.yaml"].data["metrics"]["tpot_p99_ms"] == 8.0
    assert recipes["smallest-memory.yaml"].data["metrics"]["peak_memory_mb"] == 200.0
    assert all(r.data["gate"]["passed"] and r.config.quant == "none" for r in recipes.values())  # gated: never
    assert all(r.config.batch_size != 16 for r in recipes.values())  # infeasible: never
    assert best.data["deploy"]["command"] == f"autotune serve {out / best.path.relative_to(out)}"
    before = {p: p.read_bytes() for p in files}
    assert _export(url, out) == 0
    assert {p: p.read_bytes() for p in out.rglob("*.yaml")} == before


def test_tampered_recipe_is_refused_and_force_marks_it_unverified(study, tmp_path):
    _, url = study
    _export(url, tmp_path / "r")
    path = next((tmp_path / "r").rglob("best-throughput.yaml"))
    text = path.read_text()
    path.write_text(text.replace("throughput_tok_s: 300.0", "throughput_tok_s: 3000.0", 1))
    with pytest.raises(RecipeInvalid, match="checksum"):
        load_recipe(path)
    forced = load_recipe(path, force=True)
    assert not forced.verified and "checksum" in forced.problems[0]
    assert main(["verify", str(path)]) == 2  # the CLI refuses it too, with exit 2


def test_schema_violations_and_corruption_are_refused(study, tmp_path):
    _, url = study
    _export(url, tmp_path / "r")
    path = next((tmp_path / "r").rglob("best-latency.yaml"))
    data = yaml.safe_load(path.read_text())
    data["configuration"]["kv_policy"] = "whatever"
    data["checksum"] = recipe_checksum(data)  # re-signed, yet not a valid recipe
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RecipeInvalid, match="kv_policy"):
        load_recipe(path)
    path.write_text("schema_version: 1\nmodel: [unclosed\n")
    with pytest.raises(RecipeInvalid, match="not valid YAML"):
        load_recipe(path)
    path.write_text("!!python/object/apply:os.system ['true']\n")
    with pytest.raises(RecipeInvalid):  # safe YAML only: never constructs objects
        load_recipe(path)
    data["schema_version"] = 2
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RecipeInvalid, match="version 1"):
        load_recipe(path)


def test_reexport_drops_recipes_that_left_the_front(study, tmp_path):
    import optuna
    from recipe_factory import GATE as gate

    st, url = study
    out = tmp_path / "recipes"
    _export(url, out)
    # A new trial dominating everything: the old front's digest-named recipes go.
    st.add_trial(optuna.trial.create_trial(values=[1000.0, 0.5, 10.0], user_attrs={
        "config": config(batch_size=32), "bench": bench(1000.0, 0.5, 10.0), "gate": gate, "versions": {},
        "threads": 2, "build_s": 0.1, "constraints": {}}))
    _export(url, out)
    files = sorted(p.name for p in out.rglob("*.yaml"))
    assert len(files) == 4 and all(load_recipe(p).config.batch_size == 32 for p in out.rglob("*.yaml"))


def test_export_errors_are_one_line(tmp_path, capsys):
    assert main(["export", "--study", "nope", "--storage", f"sqlite:///{tmp_path}/x.db"]) == 2
    assert "no study 'nope'" in capsys.readouterr().err


def test_a_recipe_says_when_its_figures_come_from_one_run_a_smaller_concurrency_or_an_older_gate(study, tmp_path):
    _, url = study
    out = tmp_path / "recipes"
    assert _export(url, out) == 0
    path = next(out.rglob("best-throughput.yaml"))
    assert load_recipe(path).notes == []  # three timed runs, today's gate: nothing to say
    data = yaml.safe_load(path.read_text())
    data["metrics"]["repeats"] = 1
    data["metrics"]["concurrency_peak"] = 6  # of its batch of 8: the pool held no more
    data["gate"]["version"] = "2"
    data["checksum"] = recipe_checksum(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    notes = load_recipe(path).notes
    assert any("one timed run" in n and "spread is not known" in n for n in notes)
    assert any("gated by gate version 2" in n for n in notes)
    assert any("at most 6 of its batch of 8" in n for n in notes)
