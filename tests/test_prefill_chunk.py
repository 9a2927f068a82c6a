"""The prefill chunk as a knob (config/engine_knobs.py, engine/serving.py, space/serving_knobs.py): a configuration
says it, the serving runner and the engine loop run it, its default keeps every earlier digest and label, a recipe
carries it, and only a study under latency objectives searches it."""
from __future__ import annotations

import pytest
from recipe_factory import GATE, bench, config, make_study

from autotune.config.deploy import DeployConfig
from autotune.engine import build_engine
from autotune.engine.serving import PREFILL_CHUNK, serving_runner
from autotune.recipes.recipe import load_recipe
from autotune.results.export import write_recipes
from autotune.serve.engine_loop import EngineLoop
from autotune.space.search_space import DEFAULT_SPACE, combine, load_space
from autotune.space.serving_knobs import offline_space


def test_the_default_keeps_digests_and_labels_and_another_value_is_named():
    plain = DeployConfig(batch_size=8)
    assert plain.prefill_chunk == PREFILL_CHUNK
    assert plain.digest() == DeployConfig.from_dict({k: v for k, v in plain.to_dict().items()
                                                     if k != "prefill_chunk"}).digest()
    assert "chunk" not in plain.label()
    assert DeployConfig(prefill_chunk=64).label().endswith("/on_demand/chunk=64/power=0")
    assert DeployConfig(prefill_chunk=0).label().endswith("/chunk=whole/power=0")
    assert DeployConfig(prefill_chunk=64).digest() != plain.digest()
    assert DeployConfig(prefill_chunk=64).numerics_key() == plain.numerics_key()  # it changes speed, not numbers
    with pytest.raises(ValueError, match="prefill_chunk must be >= 0"):
        DeployConfig(prefill_chunk=-1)


@pytest.mark.parametrize("chunk, runs", [(64, 64), (0, None), (256, 256)])
def test_the_serving_runner_and_the_engine_loop_run_the_configurations_chunk(tiny_llama, chunk, runs):
    engine = build_engine(tiny_llama, DeployConfig(batch_size=2, page_size=8, dtype="fp32", prefill_chunk=chunk))
    assert serving_runner(engine, 64).prefill_chunk == runs
    assert serving_runner(engine, 64, prefill_chunk=16).prefill_chunk == 16  # given: that instead
    assert EngineLoop(engine, 64, 4)._runner.prefill_chunk == runs


def test_an_offline_study_drops_the_knob_and_one_under_an_slo_searches_it(tmp_path):
    space = load_space(DEFAULT_SPACE)
    assert space.dimension("prefill_chunk").values == (256, 64, 128, 512, 0)
    offline = offline_space(space)
    assert "prefill_chunk" not in {d.name for d in offline.dimensions}
    assert "searched under --slo" in offline.dropped["prefill_chunk"]
    assert offline.grid_size() * 5 == space.grid_size()
    (tmp_path / "o.yaml").write_text("version: 1\nruntime: openvino\ndimensions:\n  batch_size: {values: [8]}\n"
                                     "  device_power: {values: [2]}\n  weight_format: {values: [fp16]}\n")
    both = combine([space, load_space(tmp_path / "o.yaml")])
    dropped = offline_space(both)
    assert "prefill_chunk" not in {d.name for d in dropped.dimensions}
    assert all("prefill_chunk" not in {d.name for d in part.dimensions} for part in dropped.parts)
    assert offline_space(offline) == offline  # nothing left to drop


def test_a_recipe_carries_it_and_loads(tmp_path, tiny_model_folder):
    study, url = make_study(tmp_path, tiny_model_folder, tmp_path,
                            points=[(config(prefill_chunk=64), bench(200.0, 10.0, 100.0), GATE, {})])
    path = next(p for p in write_recipes(study, tmp_path / "recipes", url) if p.name == "best-throughput.yaml")
    assert load_recipe(path).config.prefill_chunk == 64
