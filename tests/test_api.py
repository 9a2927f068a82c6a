"""The Python API, `autotune.search`, on the simulator: its result matches the study, a second call resumes the
study, the baseline trial is queued once, bad input is refused, and `autotune search` gives the same result."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

import autotune
from autotune.api import SearchOptions, SearchResult, search_defaults
from autotune.cli.main import build_parser, main
from autotune.errors import BackendUnavailable, ModelNotFound, UserInputError
from autotune.results.front import pareto_trials
from autotune.results.tables import pareto_table, study_summary
from autotune.space.search_space import DEFAULT_SPACE, load_space
from autotune.space.serving_knobs import offline_space
from autotune.study.coordination import counted
from autotune.study.setup import BASELINE_ROLE, enqueue_baseline

SIM = dict(model="llama-7b", backend="sim", hardware="a100-80g", seed=0, minutes=0)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))


def _search(tmp_path: Path, **kw) -> SearchResult:
    return autotune.search(**{**SIM, "storage": f"sqlite:///{tmp_path}/s.db", "out": tmp_path / "recipes", **kw})


def _study(result: SearchResult) -> optuna.Study:
    return optuna.load_study(study_name=result.study, storage=result.storage)


def test_the_result_holds_the_studys_figures_and_its_recipes(tmp_path):
    result = _search(tmp_path, trials=4)
    study = _study(result)
    assert result.study == "llama-7b-sim-a100-80g" and result.storage == f"sqlite:///{tmp_path}/s.db"
    assert result.trials.total == len(study.trials) == 4 and result.trials.complete == 4
    assert result.summary == study_summary(study) and result.table == pareto_table(study)
    front = pareto_trials(study)
    assert [p.number for p in result.front] == [t.number for t in front] and front
    for point, trial in zip(result.front, front):
        assert (point.throughput_tok_s, point.tpot_p99_ms, point.peak_memory_mb) == tuple(trial.values)
        assert point.config == trial.user_attrs["config"] and point.label == trial.user_attrs["label"]
    assert result.best_throughput.throughput_tok_s == max(t.values[0] for t in front)
    assert result.best_latency.tpot_p99_ms == min(t.values[1] for t in front)
    assert result.smallest_memory.peak_memory_mb == min(t.values[2] for t in front)
    names = {p.name for p in result.recipes}
    assert {"best-throughput.yaml", "best-latency.yaml", "smallest-memory.yaml"} <= names
    assert all(p.is_file() and p.parent.parent.parent == tmp_path / "recipes" for p in result.recipes)


def test_a_second_call_resumes_the_study_and_queues_the_baseline_once(tmp_path):
    first = _search(tmp_path, trials=3)
    before = [(t.number, t.params, t.values) for t in _study(first).trials]
    again = _search(tmp_path, trials=2)
    trials = _study(again).trials
    # 2 more, the 3 finished ones kept; a sampler's repeat of a measured configuration is told its result, no trial
    assert again.trials.total == len(trials) and len(counted(trials)) == 5 == len(trials) - again.trials.repeats
    assert [(t.number, t.params, t.values) for t in trials[:3]] == before
    space = offline_space(load_space(DEFAULT_SPACE))  # as an offline search has it
    baseline = space.trial_params(space.baseline_params())
    assert [t.number for t in trials if t.user_attrs.get("role") == BASELINE_ROLE] == [0]
    assert trials[0].params == baseline
    assert not any(t.system_attrs.get("fixed_params") == baseline for t in trials[1:])  # never queued again


def test_the_baseline_is_queued_once_through_the_spaces_parameter_names():
    space = load_space(DEFAULT_SPACE)
    study = optuna.create_study(directions=["maximize", "minimize", "minimize"])
    assert enqueue_baseline(study, space) and not enqueue_baseline(study, space)
    (waiting,) = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert waiting.system_attrs["fixed_params"] == space.trial_params(space.baseline_params())
    assert waiting.user_attrs["role"] == BASELINE_ROLE


@pytest.mark.parametrize("change, error, words", [
    ({"backend": "tpu"}, BackendUnavailable, "unknown backend 'tpu'"),
    ({"model": "llama-70b-typo"}, ModelNotFound, "llama-70b-typo"),
    ({"trials": 0}, UserInputError, "trials must be a positive whole number"),
    ({"minutes": -1}, UserInputError, "minutes must be 0 or more"),
    ({"min_agreement": 1.5}, UserInputError, "between 0 and 1"),
    ({"sampler": "magic"}, UserInputError, "unknown sampler 'magic'"),
    ({"prompt_tokens": (90, 10)}, UserInputError, "bad workload"),
    ({"prompt_tokens": "112:144"}, UserInputError, "a (min, max) pair"),
    ({"memory_budget_mb": 0}, UserInputError, "memory_budget_mb must be a positive number"),
    ({"guided": "no"}, UserInputError, "guided must be True or False"),
])
def test_bad_input_is_refused_before_a_study_is_opened(tmp_path, change, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        _search(tmp_path, **{"trials": 1, **change})
    assert not (tmp_path / "s.db").exists()


@pytest.mark.slow
def test_the_cli_gives_the_same_result_and_prints_it(tmp_path, capsys):
    cli, api = tmp_path / "cli", tmp_path / "api"
    code = main(["search", "--model", "llama-7b", "--backend", "sim", "--hardware", "a100-80g", "--trials", "4",
                 "--seed", "0", "--timeout", "0", "--storage", f"sqlite:///{cli}/s.db", "--out", str(cli / "r")])
    assert code == 0
    printed = capsys.readouterr().out
    result = autotune.search(**{**SIM, "trials": 4, "storage": f"sqlite:///{api}/s.db", "out": api / "r"})
    capsys.readouterr()
    from_cli = optuna.load_study(study_name=result.study, storage=f"sqlite:///{cli}/s.db")
    assert [(t.params, t.values) for t in from_cli.trials] == [(t.params, t.values) for t in _study(result).trials]
    assert printed == "\n".join([result.summary, result.table, *(f"recipe: {cli / p.relative_to(api)}"
                                                                  for p in result.recipes)]) + "\n"


def test_the_cli_takes_its_defaults_from_the_api():
    args = build_parser().parse_args(["search"])
    defaults = search_defaults()
    assert {name: getattr(args, name) for name in defaults} == defaults
    assert [f.name for f in dataclasses.fields(SearchOptions)] == list(defaults)


@pytest.mark.slow
def test_import_autotune_stays_cheap():
    code = ("import sys, autotune; assert 'optuna' not in sys.modules and 'torch' not in sys.modules; "
            "import autotune.api; assert autotune.search is autotune.api.search")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
