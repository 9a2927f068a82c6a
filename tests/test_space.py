"""Search spaces as data: the default file, conditions, restrictions, and errors that name file and line."""
from __future__ import annotations

import optuna
import pytest

from autotune.config.deploy import DeployConfig
from autotune.errors import SpaceError
from autotune.space.search_space import DEFAULT_SPACE, load_space


def test_default_space_has_every_knob_and_a_valid_baseline():
    space = load_space(DEFAULT_SPACE)
    assert [d.name for d in space.dimensions] == ["dtype", "quant", "quant_method", "fallback_layers", "fusion_level",
                                                  "layers_per_subgraph", "batch_size", "page_size", "kv_policy",
                                                  "device_power"]
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
    # x (O0 + O1/O2 x 5 splits) x batch 5 x page 5 x policy 3 x power 4
    assert load_space(DEFAULT_SPACE).grid_size() == 3 * (1 + 5 + 3 * 5 + 2 * 5) * (1 + 2 * 5) * 5 * 5 * 3 * 4


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
    ("dimensions:\n  n_batch: {values: [512, 256]}\n  n_ubatch:\n    values: [512]\n", 3, "n_ubatch 512 is above "
     "n_batch 256"),
    ("dimensions:\n  flash_attn: {values: [\"on\", \"off\"]}\n  kv_type:\n    values: [f16, q8_0]\n", 3,
     "needs flash attention"),
    ("dimensions:\n  flash_attn:\n    values: [on, off]\n", 3, 'quote it: "on"'),
])
def test_bad_space_names_file_and_line(tmp_path, text, line, words):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(SpaceError) as err:
        load_space(path)
    assert str(err.value).startswith(f"{path}:{line}:"), str(err.value)
    assert words in str(err.value)


def test_llamacpps_knobs_are_held_aside_for_its_backend():
    """A space as loaded is the engine's: llama.cpp's knobs are held for the llamacpp backend (with_runtime), and
    dropped with the reason by the others (drop_held)."""
    space = load_space(DEFAULT_SPACE)
    held = [d.name for d in space.held["llamacpp"]]
    assert held == ["gguf_type", "flash_attn", "kv_type", "n_batch", "n_ubatch", "n_ctx"]
    assert not set(held) & {d.name for d in space.dimensions}
    assert {d.name for d in space.held["llamacpp"] if d.numerics} == {"gguf_type", "flash_attn", "kv_type"}
    llama = space.with_runtime("llamacpp")
    assert llama.fixed == {"runtime": "llamacpp"} and not llama.held
    assert llama.dimension("kv_type").when == {"flash_attn": ("on",)}
    dropped = space.drop_held("not here")
    assert not dropped.held and all(dropped.dropped[name] == "dropped: not here" for name in held)


def test_missing_space_file_is_a_clear_error(tmp_path):
    with pytest.raises(SpaceError, match="cannot read"):
        load_space(tmp_path / "nope.yaml")
