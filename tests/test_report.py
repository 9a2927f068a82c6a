"""The HTML report: self-contained, every section present, simulated studies labelled, small studies handled."""
from __future__ import annotations

import optuna
import pytest
from view_factory import scripted_study

from autotune.cli import main
from autotune.results.report import build_report
from autotune.results.report_data import points, recipe_rows, search_cost


@pytest.fixture()
def study(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    return scripted_study(tmp_path)


@pytest.mark.slow
def test_report_is_one_offline_file_with_every_section(study):
    st, _, recipes = study
    page = build_report(st, recipes)
    assert page.count("<script") >= 6 and 'src="http' not in page  # plotly.js inlined, nothing fetched
    for div in ("pareto", "pareto-memory", "outcomes", "accuracy", "importance", "history"):
        assert f'id="{div}"' in page
    assert "MEASURED on this hardware" in page and "Cost of the search" in page and "best-throughput" in page


@pytest.mark.slow
def test_every_trial_has_one_outcome_and_the_cost_counts_them(study):
    st, _, recipes = study
    outcomes = {p.number: p.outcome for p in points(st)}
    assert len(outcomes) == len(st.trials)
    states = {t.number: t.state for t in st.trials}
    assert all((o == "gated") == (states[n] == optuna.trial.TrialState.PRUNED) for n, o in outcomes.items())
    assert all((o == "failed") == (states[n] == optuna.trial.TrialState.FAIL) for n, o in outcomes.items())
    cost = search_cost(st)
    assert int(cost["gate rejections (not benchmarked)"]) == sum(o == "gated" for o in outcomes.values()) > 0
    rows = recipe_rows(st, recipes)
    assert rows and all(r["exported"] for r in rows)
    assert {r["trial"] for r in rows} == {n for n, o in outcomes.items() if o == "front"}


def test_simulated_study_is_labelled_and_a_one_trial_study_still_reports(tmp_path):
    url = f"sqlite:///{tmp_path}/one.db"
    st = optuna.create_study(study_name="one", storage=url, directions=["maximize", "minimize", "minimize"])
    st.set_user_attr("measured", False)
    bench = {"throughput_tok_s": 10.0, "tpot_p99_ms": 5.0, "peak_memory_mb": 100.0, "ttft_p50_ms": 1.0}
    st.add_trial(optuna.trial.create_trial(values=[10.0, 5.0, 100.0], params={"batch_size": 1},
                                           distributions={"batch_size": optuna.distributions.CategoricalDistribution(
                                               [1, 2])}, user_attrs={"bench": bench, "config": {"quant": "none"}}))
    page = build_report(st, tmp_path / "recipes")
    assert "SIMULATED" in page and "Too few trials" in page


@pytest.mark.slow
def test_report_command_writes_the_file_and_a_missing_study_exits_2(study, tmp_path, capsys):
    _, url, recipes = study
    out = tmp_path / "r.html"
    assert main(["report", "--study", "view", "--storage", url, "--out", str(out), "--recipes", str(recipes)]) == 0
    assert out.stat().st_size > 1_000_000
    assert main(["report", "--study", "nope", "--storage", url, "--out", str(out)]) == 2
    assert "no study 'nope'" in capsys.readouterr().err
