"""Warm start: kept recipes for the same model and hardware are enqueued once, in this space's terms."""
from __future__ import annotations

import optuna
import yaml

from autotune.config.deploy import DeployConfig
from autotune.recipes.warm_start import enqueue_recipes
from autotune.space.search_space import DEFAULT_SPACE, load_space
from autotune.space.serving_knobs import offline_space


def _recipe(folder, name, config: DeployConfig) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(yaml.safe_dump({"configuration": config.to_dict()}))


def test_recipes_are_enqueued_once_and_only_if_the_space_holds_them(tmp_path):
    space = offline_space(load_space(DEFAULT_SPACE)).restrict("device_power", (1, 2), "2 cores")
    folder = tmp_path / "m" / "hw"
    fused = DeployConfig(quant="none", fusion_level="O2", layers_per_subgraph=0, batch_size=8, page_size=64,
                         device_power=2)
    _recipe(folder, "a.yaml", fused)
    _recipe(folder, "best-throughput.yaml", fused)  # the same configuration under its pick's name
    _recipe(folder, "b.yaml", DeployConfig(batch_size=3, device_power=2))  # batch 3 is not in the space
    (folder / "broken.yaml").write_text("configuration: [")
    study = optuna.create_study(directions=["maximize", "minimize", "minimize"])
    assert enqueue_recipes(study, space, tmp_path, "m", "hw") == 1
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [t.system_attrs["fixed_params"] for t in waiting] == [
        {"dtype": "bf16", "quant": "none", "fusion_level": "O2", "layers_per_subgraph": "all", "batch_size": 8,
         "page_size": 64, "kv_policy": "on_demand", "device_power": 2}]
    assert waiting[0].user_attrs["role"] == "warm-start"
    assert enqueue_recipes(study, space, tmp_path, "m", "hw") == 0  # already there
    assert enqueue_recipes(study, space, tmp_path, "m", "other-hw") == 0


def test_other_classes_of_the_same_backend_follow_nearest_first_and_other_backends_never(tmp_path):
    space = offline_space(load_space(DEFAULT_SPACE)).restrict("device_power", (1, 2), "2 cores")
    root = tmp_path / "m"
    configs = {name: DeployConfig(batch_size=b, device_power=2) for name, b in
               (("cpu-amd-epyc-16c", 16), ("cpu-amd-epyc-2c", 8), ("cuda-h100", 4), ("cpu-intel-xeon-2c", 2))}
    for name, config in configs.items():
        _recipe(root / name, "r.yaml", config)
    study = optuna.create_study(directions=["maximize", "minimize", "minimize"])
    assert enqueue_recipes(study, space, tmp_path, "m", "cpu-intel-xeon-2c") == 3
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    # Its own class, then the 2-core EPYC (same size), then the 16-core one; the GPU's recipe is not a CPU's.
    assert [t.user_attrs["warm_start_class"] for t in waiting] == ["cpu-intel-xeon-2c", "cpu-amd-epyc-2c",
                                                                  "cpu-amd-epyc-16c"]
    assert [t.system_attrs["fixed_params"]["batch_size"] for t in waiting] == [2, 8, 16]
