"""Warm start: the configurations of the recipes already kept for this model and hardware class are tried first
(re-measured, never copied), as engineers start from a recipe table before they tune."""
from __future__ import annotations

from pathlib import Path

import optuna
import yaml

from autotune.progress import log
from autotune.recipes.recipe import recipe_dir
from autotune.space.search_space import SearchSpace

__all__ = ["enqueue_recipes"]


def _params(config: dict, space: SearchSpace) -> dict | None:
    """The recipe's configuration as this space's parameters; None when the space cannot express it."""
    params: dict = {}
    for dim in space.dimensions:
        if not dim.applies(params):
            continue
        value = config.get(dim.name)
        if dim.name == "layers_per_subgraph" and value == 0:
            value = "all"
        if value not in dim.values:
            return None
        params[dim.name] = value
    return params


def enqueue_recipes(study: optuna.Study, space: SearchSpace, out: str | Path, model: str, hardware: str) -> int:
    """Enqueue each distinct recipe configuration under out/<model>/<hardware>/ that the study has not tried."""
    folder = recipe_dir(out, model, hardware)
    # Waiting (enqueued) trials carry their parameters as fixed_params until they run.
    tried = [t.params or t.system_attrs.get("fixed_params", {}) for t in study.trials]
    count = 0
    for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
        try:
            config = yaml.safe_load(path.read_text())["configuration"]
        except (OSError, yaml.YAMLError, KeyError, TypeError):
            log(f"warm start: {path} is not a readable recipe, skipped")
            continue
        params = _params(config, space)
        if params is None or params in tried:
            continue
        study.enqueue_trial(params, user_attrs={"role": "warm-start", "warm_start_recipe": path.name})
        tried.append(params)
        count += 1
    if count:
        log(f"warm start: {count} configurations from the recipes in {folder} are tried first")
    return count
