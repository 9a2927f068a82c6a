"""Warm start: kept recipes for the same model and hardware are enqueued once, in this space's terms."""
from __future__ import annotations

import optuna
import yaml

from autotune.config.deploy import DeployConfig
from autotune.recipes.warm_start import enqueue_recipes
from autotune.space.search_space import DEFAULT_SPACE, load_space


def _recipe(folder, name, config: DeployConfig) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(yaml.safe_dump({"configuration": config.to_dict()}))


def test_recipes_are_enqueued_once_and_only_if_the_space_holds_them(tmp_path):
    space = load_space(DEFAULT_SPACE).restrict("device_power", (1, 2), "2 cores")
    folder = tmp_path / "m" / "hw"
    fused = DeployConfig(quant="bf16", fusion_level="O2", layers_per_subgraph=0, batch_size=8, page_size=64,
                         device_power=2)
    _recipe(folder, "a.yaml", fused)
    _recipe(folder, "best-throughput.yaml", fused)  # the same configuration under its pick's name
    _recipe(folder, "b.yaml", DeployConfig(batch_size=3, device_power=2))  # batch 3 is not in the space
    (folder / "broken.yaml").write_text("configuration: [")
    study = optuna.create_study(directions=["maximize", "minimize", "minimize"])
    assert enqueue_recipes(study, space, tmp_path, "m", "hw") == 1
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [t.system_attrs["fixed_params"] for t in waiting] == [{"quant": "bf16", "fusion_level": "O2", "layers_per_subgraph": "all",
                                            "batch_size": 8, "page_size": 64, "kv_policy": "on_demand",
                                            "device_power": 2}]
    assert waiting[0].user_attrs["role"] == "warm-start"
    assert enqueue_recipes(study, space, tmp_path, "m", "hw") == 0  # already there
    assert enqueue_recipes(study, space, tmp_path, "m", "other-hw") == 0
