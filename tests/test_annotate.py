"""Dashboard notes and recipe artifacts: one note per Pareto trial, files downloadable, annotating twice is a no-op."""
from __future__ import annotations

import optuna
import pytest
from optuna_dashboard import get_note
from view_factory import scripted_study

from autotune.results.annotate import annotate_study, artifact_dir
from autotune.results.front import pareto_trials
from autotune.study.optuna_private import live_trial, study_system_attrs, trial_id


@pytest.fixture()
def study(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    return scripted_study(tmp_path)


def _artifacts(st: optuna.Study, trial) -> list[dict]:
    import json

    prefix = f"dashboard:artifacts:{trial_id(trial)}:"
    return [json.loads(v) for k, v in study_system_attrs(st).items()
            if k.startswith(prefix) and json.loads(v) is not None]


@pytest.mark.slow
def test_export_notes_every_pareto_trial_and_attaches_its_recipes(study, tmp_path):
    st, url, _ = study
    assert artifact_dir(url) == tmp_path / "artifacts"
    front = pareto_trials(st)
    assert front
    for t in front:
        note = get_note(live_trial(st, t))
        assert f"Pareto point #{t.number}" in note and "x the baseline" in note and "**Recipe:**" in note
        files = _artifacts(st, t)
        assert files and all((tmp_path / "artifacts" / f["artifact_id"]).is_file() for f in files)
        assert any(f["filename"].endswith(".yaml") for f in files)


@pytest.mark.slow
def test_annotating_again_changes_nothing_and_a_changed_recipe_replaces_its_artifact(study, tmp_path):
    st, url, recipes = study
    paths = sorted(recipes.rglob("*.yaml"))
    assert annotate_study(st, paths, artifact_dir(url)) == (0, 0)
    target = paths[0]
    target.write_text(target.read_text() + "# edited\n")
    notes, uploads = annotate_study(st, paths, artifact_dir(url))
    assert (notes, uploads) == (0, 1)
    owner = next(t for t in pareto_trials(st) if any(f["filename"] == target.name for f in _artifacts(st, t)))
    assert [f["filename"] for f in _artifacts(st, owner)].count(target.name) == 1
