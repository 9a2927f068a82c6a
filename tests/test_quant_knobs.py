"""The quant_method and fallback_layers knobs: configuration, search space (per-scheme methods), what backends drop,
and recipes that list the layers kept (and still load without them)."""
from __future__ import annotations

import hashlib
import json

import optuna
import pytest
import yaml

from autotune.config.calibration import SENSITIVITY_SAMPLES
from autotune.config.deploy import DeployConfig
from autotune.devices.base import apply_limits
from autotune.devices.npu import NpuDevice
from autotune.engine import build_engine
from autotune.engine.quant import decoder_linear_names, is_converted
from autotune.errors import SpaceError
from autotune.quant.plan import calibration_dir, quant_plan
from autotune.recipes.recipe import build_recipe, load_recipe, write_recipe
from autotune.recipes.warm_start import enqueue_recipes
from autotune.space.search_space import DEFAULT_SPACE, load_space
from autotune.study.loop import run_search
from autotune.study.settings import OBJECTIVES, SearchSettings, make_sampler
from autotune.trial.job import Status
from autotune.trial.run import quant_record
from tests.plan_env import SAMPLES, plan_env
from tests.recipe_factory import GATE, bench, make_study
from tests.test_study import ScriptedBackend


def test_defaults_keep_digest_label_and_gate_key_of_earlier_configurations():
    config = DeployConfig(quant="w8a8", fusion_level="O2", layers_per_subgraph=4, batch_size=8)
    before = {k: v for k, v in config.to_dict().items()
              if k not in ("quant_method", "fallback_layers", "dtype", "prefill_chunk")}
    assert config.digest() == hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()[:12]
    assert config.label() == "w8a8@bf16/O2/split=4/bs=8/page=128/on_demand/power=0"
    # The scheme "bf16" of before the dtype knob reads as quant none in bf16, with its digest and gate key.
    legacy = {"quant": "bf16", "fusion_level": "O0", "layers_per_subgraph": None, "batch_size": 8, "page_size": 128,
              "kv_policy": "on_demand", "device_power": 0}
    plain = DeployConfig.from_dict(legacy)
    assert (plain.quant, plain.dtype, plain.label()) == ("none", "bf16", "bf16/O0/bs=8/page=128/on_demand/power=0")
    assert plain.digest() == hashlib.sha256(json.dumps(legacy, sort_keys=True).encode()).hexdigest()[:12]
    assert plain.numerics_key() == json.dumps({"quant": "bf16", "fusion_level": "O0", "layers_per_subgraph": None},
                                              sort_keys=True)
    assert DeployConfig(quant="none", dtype="fp32").numerics_key() != plain.numerics_key()
    with pytest.raises(ValueError, match="now quant 'none' with dtype 'bf16'"):
        DeployConfig(quant="bf16")
    assert config.numerics_key() == json.dumps({"quant": "w8a8", "fusion_level": "O2", "layers_per_subgraph": 4},
                                               sort_keys=True)
    calibrated = DeployConfig(quant="w8a8", quant_method="smoothquant_static", fallback_layers=2)
    assert calibrated.label().startswith("w8a8+smoothquant_static+fb2@bf16/O0/")
    assert calibrated.numerics_key() != DeployConfig(quant="w8a8").numerics_key() != DeployConfig(
        quant="w8a8", fallback_layers=2).numerics_key()
    assert DeployConfig.from_dict({k: v for k, v in calibrated.to_dict().items()}) == calibrated


@pytest.mark.parametrize("kw, message", [
    ({"quant": "w4a16", "quant_method": "smoothquant_static"}, "quant_method for w4a16"),
    ({"quant": "w8a8", "quant_method": "awq"}, "quant_method for w8a8"),
    ({"quant": "none", "quant_method": "awq"}, "quant_method for none"),
    ({"quant": "none", "fallback_layers": 2}, "0 for quant none"),
    ({"quant": "w8a16", "fallback_layers": -1}, "fallback_layers must be >= 0"),
])
def test_methods_are_meaningful_per_scheme(kw, message):
    with pytest.raises(ValueError, match=message):
        DeployConfig.from_dict(kw)


def test_the_default_space_searches_methods_per_scheme_under_their_own_optuna_names():
    space = load_space(DEFAULT_SPACE)
    method = space.dimension("quant_method")
    assert method.numerics and space.dimension("fallback_layers").numerics
    assert method.choices == {"w8a8": ("rtn", "smoothquant_static", "smoothquant_dynamic"), "w4a16": ("rtn", "awq")}
    assert space.dimension("fallback_layers").values == (0, 1, 2, 4, 8)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(80):
        trial = study.ask()
        params = space.suggest(trial)
        config = DeployConfig.from_params(params)  # every suggestion is a valid configuration
        assert ("quant_method" in params) == (config.quant in ("w8a8", "w4a16"))
        assert ("fallback_layers" in params) == (config.quant != "none")
        assert trial.params == space.trial_params(params)
        seen.add((config.quant, config.quant_method))
        study.tell(trial, 0.0)
    assert {("w8a8", "smoothquant_static"), ("w4a16", "awq"), ("w8a8", "rtn"), ("w4a16", "rtn")} <= seen
    assert "quant_method[w8a8]" in study.trials[-1].distributions or "quant_method[w4a16]" in {
        n for t in study.trials for n in t.distributions}
    assert len(space.grid()) == space.grid_size()


def test_a_method_a_device_cannot_run_is_dropped_with_the_reason():
    space = apply_limits(load_space(DEFAULT_SPACE), NpuDevice().limits())
    assert space.dimension("quant_method").choices["w8a8"] == ("rtn", "smoothquant_dynamic")
    assert "smoothquant_static" in space.dropped["quant_method"] and "npu_quant_matmul" in space.dropped["quant_method"]


def test_the_simulator_drops_the_knobs_it_has_no_terms_for():
    from autotune.backends.sim import SimBackend

    space = SimBackend("h100").adapt_space(load_space(DEFAULT_SPACE))
    names = {d.name for d in space.dimensions}
    assert "quant_method" not in names and "fallback_layers" not in names
    assert "accuracy" in space.dropped["quant_method"] and "per-layer" in space.dropped["fallback_layers"]


@pytest.mark.parametrize("text, message", [
    ("quant_method:\n    by: quant\n    values: {w4a16: [rtn, smoothquant_static]}\n",
     "'smoothquant_static' is not a valid value for quant=w4a16"),
    ("quant_method:\n    by: quant\n    values: {fp8: [rtn]}\n", "'fp8' is not a value of quant"),
    ("quant_method:\n    by: fusion_level\n    values: {O0: [rtn]}\n", "must be a dimension defined above it"),
    ("fallback_layers:\n    values: [0, -2]\n", "-2 is not a valid value"),
])
def test_space_errors_about_the_new_knobs_name_the_line(tmp_path, text, message):
    path = tmp_path / "space.yaml"
    path.write_text("version: 1\ndimensions:\n  quant:\n    values: [none, w8a8, w4a16]\n  " + text)
    with pytest.raises(SpaceError, match=message):
        load_space(path)


QUANT = {"method": "smoothquant_static", "fallback_layers": 2, "kept_layers": ["layers.4.down_proj", "layers.0.o_proj"],
         "decoder_linear_layers": 16, "converted": 14, "kept": ["layers.0.o_proj", "layers.4.down_proj"],
         "calibration": {"samples": 512, "sample_tokens": 64, "digest": "abc"},
         "sensitivity": {"scheme": "w8a8", "method": "smoothquant_static", "measure": "relative output error",
                         "ranking": [["layers.4.down_proj", 0.2], ["layers.0.o_proj", 0.1], ["layers.1.o_proj", 0.01]]}}


def _study_with(tmp_path, model, config: DeployConfig, quant: dict):
    study, url = make_study(tmp_path, model, tmp_path)
    figures = bench(200.0, 10.0, 100.0)
    user = {"config": config.to_dict(), "bench": figures, "gate": GATE, "versions": {"torch": "x"}, "threads": 2,
            "build_s": 0.5, "constraints": {}, "quant": quant}
    study.add_trial(optuna.trial.create_trial(values=[200.0, 10.0, 100.0], user_attrs=user))
    return study, url


def test_a_recipe_lists_the_layers_kept_and_old_recipes_still_load(tiny_model_folder, tmp_path):
    config = DeployConfig(quant="w8a8", quant_method="smoothquant_static", fallback_layers=2, batch_size=4,
                          device_power=2)
    study, url = _study_with(tmp_path, tiny_model_folder, config, QUANT)
    recipe = build_recipe(study, study.trials[0], url, ["best-throughput"])
    assert recipe["quantization"]["kept_layers"] == ["layers.4.down_proj", "layers.0.o_proj"]
    assert recipe["quantization"]["sensitivity"]["kept"] == {"layers.4.down_proj": 0.2, "layers.0.o_proj": 0.1}
    assert list(recipe).index("quantization") == list(recipe).index("configuration") + 1
    path = tmp_path / "r.yaml"
    write_recipe(path, recipe)
    loaded = load_recipe(path)
    assert loaded.config.quant_method == "smoothquant_static" and loaded.kept_layers == (
        "layers.4.down_proj", "layers.0.o_proj")
    # A recipe exported before these knobs: no fields, no section; it loads at the defaults, and warm-starts.
    old = yaml.safe_load(path.read_text())
    del old["quantization"]
    old["configuration"] = {k: v for k, v in old["configuration"].items()
                            if k not in ("quant_method", "fallback_layers")}
    old["configuration"]["quant"] = "w8a16"
    from autotune.recipes.recipe import recipe_checksum

    old["checksum"] = recipe_checksum(old)
    old_path = tmp_path / "recipes" / "tiny" / "hw" / "old.yaml"
    old_path.parent.mkdir(parents=True)
    old_path.write_text(yaml.safe_dump(old, sort_keys=False))
    loaded = load_recipe(old_path)
    assert (loaded.config.quant_method, loaded.config.fallback_layers, loaded.kept_layers) == ("rtn", 0, ())
    space = load_space(DEFAULT_SPACE)
    fresh = optuna.create_study()
    assert enqueue_recipes(fresh, space, tmp_path / "recipes", "tiny", "hw") == 1
    trial = fresh.ask()
    assert DeployConfig.from_params(space.suggest(trial)).quant == "w8a16"
    assert trial.params["fallback_layers"] == 0


def test_rtn_without_fallback_adds_no_quantization_section(tiny_model_folder, tmp_path):
    study, url = _study_with(tmp_path, tiny_model_folder, DeployConfig(quant="w8a16"),
                             {"decoder_linear_layers": 16, "converted": 16, "kept": []})
    assert "quantization" not in build_recipe(study, study.trials[0], url, [])


class _BuildingBackend(ScriptedBackend):
    """The scripted gate and figures, but each quantized trial really plans and builds its engine on the tiny model
    (calibration, sensitivity, fallback) and reports its quantize step as a trial does. It also notes, per
    configuration, the layers the built engine left unconverted, read from its modules."""

    def __init__(self, spec, tokenizer, hf) -> None:
        super().__init__()
        self.spec, self.tokenizer, self.hf = spec, tokenizer, hf
        self.plain: dict[str, list[str]] = {}

    def run(self, job, timeout_s):
        result = super().run(job, timeout_s)
        config = DeployConfig.from_dict(job.config)
        if config.quant != "none" and result.status is not Status.ERROR:
            plan = quant_plan(self.hf, self.spec, self.tokenizer, config)
            engine = build_engine(self.hf, config, plan=plan)
            modules = dict(engine.model.named_modules())
            self.plain[config.digest()] = sorted(name for fqn, name in decoder_linear_names(engine.model).items()
                                                 if not is_converted(modules[fqn]))
            result.quant = quant_record(plan, engine)
        return result


@pytest.mark.slow
def test_the_study_stores_each_sensitivity_once_and_each_trial_the_layers_its_build_kept(tiny_model_folder,
                                                                                         tmp_path, monkeypatch):
    spec, tokenizer, hf, drawn = plan_env(tiny_model_folder, tmp_path / "cache", monkeypatch)
    path = tmp_path / "space.yaml"
    path.write_text("version: 1\ndimensions:\n  quant:\n    values: [none, w8a16, w8a8]\n  quant_method:\n"
                    "    by: quant\n    values: {w8a8: [rtn, smoothquant_dynamic]}\n  fallback_layers:\n"
                    "    values: [0, 2, 4]\n    when: {quant: [w8a16, w8a8]}\n  batch_size:\n    values: [1, 2, 4]\n")
    space = load_space(path)
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db",
                                directions=[d for _, d in OBJECTIVES], sampler=make_sampler("random", 0))
    study.set_user_attr("model_checksum", "sha256:x")
    study.set_user_attr("eval_digest", "d")
    writes: list[str] = []
    set_user_attr = optuna.Study.set_user_attr
    monkeypatch.setattr(optuna.Study, "set_user_attr",
                        lambda self, key, value: writes.append(key) or set_user_attr(self, key, value))
    backend = _BuildingBackend(spec, tokenizer, hf)
    run_search(SearchSettings(model="m", study="s", storage=f"sqlite:///{tmp_path}/s.db", trials=16), space,
               backend, study)
    quantized = [t for t in study.trials if t.user_attrs.get("quant")]
    configs = {t.number: DeployConfig.from_dict(t.user_attrs["config"]) for t in quantized}
    deep = [c for c in configs.values() if c.fallback_layers]
    assert deep and len(deep) > len({(c.quant, c.quant_method) for c in deep}), \
        "the random sampler drew several fallback trials of one scheme and method"
    attrs = study.user_attrs
    for t in quantized:
        quant, config = t.user_attrs["quant"], configs[t.number]
        # What the trial recorded is what its engine kept: the layers its modules left unconverted.
        assert sorted(quant.get("kept_layers", [])) == quant["kept"] == backend.plain[config.digest()]
        if not config.fallback_layers:
            assert quant["kept"] == []
            continue
        # ... and they are the most sensitive layers of the ranking the study stores for its scheme and method,
        # which is the ranking the measurement wrote to its cache.
        key = f"sensitivity:{config.quant}:{config.quant_method}"
        ranking = attrs[key]["ranking"]
        assert quant["kept_layers"] == [name for name, _ in ranking[:config.fallback_layers]]
        cached = json.loads((calibration_dir(spec) / f"sensitivity-{config.quant}-{config.quant_method}.json")
                            .read_text())["ranking"]
        assert [name for name, _ in ranking] == [name for name, _ in cached]
    # Each ranking and each calibration record written to the study once, however many trials used it.
    stored = [k for k in writes if k.startswith(("sensitivity:", "calibration"))]
    assert stored and len(stored) == len(set(stored))
    assert attrs.get("calibration:sensitivity", {}).get("samples", SENSITIVITY_SAMPLES) == SENSITIVITY_SAMPLES
    if "calibration" in attrs:  # a calibrated method drew the whole (here: shortened) set, once
        assert attrs["calibration"]["samples"] == SAMPLES and len(drawn) == 1
