"""A peak memory that could not be reset before the runs (/proc/PID/clear_refs refused, as in some containers) also
holds loading and building: the benchmark records that beside the figure, and the front's table marks it."""
from __future__ import annotations

import optuna
import pytest

from autotune.benchmark import bench, meter
from autotune.benchmark.peak_rss import rss_bytes
from autotune.benchmark.policy import RunPolicy
from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.engine import build_engine
from autotune.results.tables import pareto_table

ONE_RUN = RunPolicy(warmup="short", max_repeats=1)
_WORKLOAD = Workload(num_requests=2, prompt_min=4, prompt_max=6, output_tokens=3)
_PROMPTS = [[1, 5, 9, 11], [3, 4, 7, 8, 2, 6]]


@pytest.mark.parametrize("refused", [False, True])
def test_the_benchmark_records_whether_the_peak_was_reset(tiny_llama, monkeypatch, refused):
    monkeypatch.setattr(meter, "reset_peak", lambda: not refused)
    engine = build_engine(tiny_llama, DeployConfig(batch_size=2, dtype="fp32"))
    results = [
        bench.benchmark_engine(engine, _PROMPTS, _WORKLOAD, policy=ONE_RUN, base_rss=rss_bytes()),
        bench.benchmark_hf_generate(tiny_llama, _PROMPTS, _WORKLOAD, batch_size=2, pad_id=0, policy=ONE_RUN,
                                    base_rss=rss_bytes()),
    ]
    for result in results:
        assert result["peak_memory_reset"] is not refused
        assert ("includes loading" in result.get("peak_memory_note", "")) is refused


def _study(reset: bool) -> optuna.Study:
    study = optuna.create_study(directions=["maximize", "minimize", "minimize"])
    figures = {"throughput_tok_s": 200.0, "ttft_p50_ms": 20.0, "tpot_p99_ms": 10.0, "peak_memory_mb": 1234.0,
               "peak_memory_reset": reset}
    study.add_trial(optuna.trial.create_trial(
        values=[200.0, 10.0, 1234.0],
        user_attrs={"config": DeployConfig().to_dict(), "bench": figures, "gate": {"tie_aware_agreement": 0.999}}))
    study.set_user_attr("speed_baseline", {"what": "generate", "batch_size": 8,
                                           "bench": {**figures, "peak_memory_mb": 567.0, "peak_memory_reset": True}})
    return study


def test_the_table_marks_a_peak_that_was_not_reset():
    marked, plain = pareto_table(_study(reset=False)), pareto_table(_study(reset=True))
    assert "1234*" in marked and "567 MB" in marked and "not reset" in marked.splitlines()[-1]
    assert "*" not in plain and "not reset" not in plain
    # The mark takes the place of a space: the columns stay where they were.
    assert [len(line) for line in marked.splitlines()[:3]] == [len(line) for line in plain.splitlines()[:3]]


def test_a_recipe_carries_the_mark(tmp_path, tiny_model_folder):
    from recipe_factory import GATE, config, make_study
    from recipe_factory import bench as figures

    from autotune.recipes.recipe import load_recipe
    from autotune.results.export import write_recipes

    study, url = make_study(tmp_path, tiny_model_folder, tmp_path, points=[
        (config(), {**figures(200.0, 10.0, 1234.0), "peak_memory_reset": False}, GATE, {}),
        (config(batch_size=8), {**figures(100.0, 20.0, 500.0), "peak_memory_reset": True}, GATE, {})])
    written = {p.name: load_recipe(p) for p in write_recipes(study, tmp_path / "recipes", url)}
    assert written["best-throughput.yaml"].data["metrics"]["peak_memory_reset"] is False
    assert "peak_memory_reset" not in written["smallest-memory.yaml"].data["metrics"]
