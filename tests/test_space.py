"""Search spaces as data: the default file, conditions, restrictions, and errors that name file and line."""
from __future__ import annotations

import optuna
import pytest

from autotune.config.deploy import LLAMACPP_KNOBS, DeployConfig
from autotune.errors import SpaceError
from autotune.space.search_space import DEFAULT_SPACE, default_space, load_space


def test_default_space_has_every_knob_and_a_valid_baseline():
    space = load_space(DEFAULT_SPACE)
    assert [d.name for d in space.dimensions] == ["dtype", "quant", "quant_method", "fallback_layers", "fusion_level",
                                                  "layers_per_subgraph", "batch_size", "page_size", "kv_policy",
                                                  "prefill_chunk", "device_power"]
    assert {d.name for d in space.dimensions if d.numerics} == {"dtype", "quant", "quant_method", "fallback_layers",
                                                                "fusion_level", "layers_per_subgraph"}
    base = space.baseline_params()
    assert "layers_per_subgraph" not in base  # eager: the split does not apply
    # dtype "fastest": the first value, as the backend's probe orders them (unprobed: the file's order)
    assert DeployConfig.from_params(base) == DeployConfig(batch_size=8, page_size=128, kv_policy="on_demand",
                                                          device_power=8, dtype="bf16")
    assert [(b.name, b.dtype, b.batch_size) for b in space.speed_baselines] == [("as_loaded", "auto", 8),
                                                                               ("fastest", "fastest", 8)]


def test_conditional_dimension_only_when_fused():
    space = load_space(DEFAULT_SPACE)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(60):
        trial = study.ask()
        params = space.suggest(trial)
        assert ("layers_per_subgraph" in params) == (params["fusion_level"] != "O0")
        DeployConfig.from_params(params)  # every suggestion is a valid configuration
        seen.add(params["fusion_level"])
        study.tell(trial, 0.0)
    assert seen == {"O0", "O1", "O2"}


def test_restrict_records_what_was_dropped_and_why():
    space = load_space(DEFAULT_SPACE).restrict("device_power", (1, 2), "2 cores")
    assert space.dimension("device_power").values == (1, 2)
    assert "2 cores" in space.dropped["device_power"] and "[4, 8]" in space.dropped["device_power"]
    dropped = space.restrict("page_size", (), "no paged cache on this backend")
    assert "page_size" not in {d.name for d in dropped.dimensions}
    assert dropped.dropped["page_size"].startswith("dropped")


def test_grid_size_counts_conditional_dimensions_once():
    # dtype 3 x quant variants: none 1 + w8a16 5 fallbacks + w8a8 3 methods x 5 + w4a16 2 methods x 5 = 31
    # x (O0 + O1/O2 x 5 splits) x batch 5 x page 5 x policy 3 x prefill chunk 5 x power 4
    assert load_space(DEFAULT_SPACE).grid_size() == 3 * (1 + 5 + 3 * 5 + 2 * 5) * (1 + 2 * 5) * 5 * 5 * 3 * 5 * 4


@pytest.mark.parametrize("text, line, words", [
    ("dimensions:\n  quant:\n    values: [none, fp7]\n", 3, "fp7"),
    ("dimensions:\n  quant: {values: [none]}\n  colour:\n    values: [red]\n", 3, "unknown dimension 'colour'"),
    ("dimensions:\n  batch_size:\n    values: [8, -1]\n", 3, "-1"),
    ("dimensions:\n  quant:\n    values: [none\n  page_size: 3\n", 4, "not valid YAML"),
    ("dimensions:\n  fusion_level: {values: [O0, O1]}\n  layers_per_subgraph:\n    values: [1]\n"
     "    when: {batch_size: [1]}\n", 5, "must be defined above"),
    ("dimensions:\n  quant: {values: [none]}\nbaseline:\n  quant: w8a16\n", 4, "not among"),
    ("dimensions:\n  quant:\n    values: [none]\n    numerics: false\n", 4, "numerics is True"),
    ("versoin: 1\ndimensions: {}\n", 1, "unknown section 'versoin'"),
    # llama.cpp's pairs it would refuse, and YAML's bare on/off.
    ("runtime: llamacpp\ndimensions:\n  n_batch: {values: [512, 256]}\n  n_ubatch:\n    values: [512]\n", 4,
     "n_ubatch 512 is above "
     "n_batch 256"),
    ("runtime: llamacpp\ndimensions:\n  flash_attn: {values: [\"on\", \"off\"]}\n  kv_type:\n    values: [f16, q8_0]\n",
     4,
     "needs flash attention"),
    ("runtime: llamacpp\ndimensions:\n  flash_attn:\n    values: [on, off]\n", 4, 'quote it: "on"'),
])
def test_bad_space_names_file_and_line(tmp_path, text, line, words):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(SpaceError) as err:
        load_space(path)
    assert str(err.value).startswith(f"{path}:{line}:"), str(err.value)
    assert words in str(err.value)


def test_a_space_file_names_its_runtime_and_holds_only_its_knobs(tmp_path):
    """The engine's space (no `runtime:`) and llama.cpp's (`runtime: llamacpp`) are files of their own; a knob of
    another runtime than the file's is refused at load with its file and line, and a configuration of the space is
    of its runtime."""
    engine = load_space(DEFAULT_SPACE)
    assert engine.runtime == "engine" and not {d.name for d in engine.dimensions} & set(LLAMACPP_KNOBS)
    assert all(engine.to_config(p).runtime == "engine" for p in engine.grid()[:20])
    llama = load_space(default_space("llamacpp"))
    assert llama.runtime == "llamacpp" and [d.name for d in llama.dimensions] == [
        "batch_size", "device_power", "gguf_type", "flash_attn", "kv_type", "n_batch", "n_ubatch", "n_ctx"]
    assert {d.name for d in llama.dimensions if d.numerics} == {"gguf_type", "flash_attn", "kv_type"}
    assert llama.dimension("kv_type").when == {"flash_attn": ("on",)}
    assert all(llama.to_config(p).runtime == "llamacpp" for p in llama.grid())
    path = tmp_path / "mixed.yaml"
    path.write_text("version: 1\ndimensions:\n  quant:\n    values: [none]\n  gguf_type:\n    values: [Q8_0]\n")
    with pytest.raises(SpaceError, match=f"^{path}:5: gguf_type is a knob of the llamacpp runtime.*llamacpp.yaml"):
        load_space(path)
    path.write_text("version: 1\nruntime: llamacpp\ndimensions:\n  quant:\n    values: [none]\n")
    with pytest.raises(SpaceError, match="quant is a knob of the engine runtime"):
        load_space(path)
    path.write_text("version: 1\nruntime: vllm\ndimensions:\n  batch_size:\n    values: [1]\n")
    with pytest.raises(SpaceError, match="runtime 'vllm' is not one of engine, llamacpp"):
        load_space(path)


def test_missing_space_file_is_a_clear_error(tmp_path):
    with pytest.raises(SpaceError, match="cannot read"):
        load_space(tmp_path / "nope.yaml")
