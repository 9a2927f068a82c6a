"""Warm start: the configurations of the recipes already kept for this model are tried first (re-measured, never
copied), as engineers start from a recipe table before they tune: this hardware class's own recipes, then those of
other classes of the same backend, nearest class first (a 2-core Xeon starts from a 2-core EPYC's recipes before a
16-core one's; a CPU never from a GPU's)."""
from __future__ import annotations

from pathlib import Path

import optuna
import yaml

from autotune.config.deploy import DeployConfig
from autotune.host import class_note
from autotune.progress import log
from autotune.recipes.recipe import recipe_dir
from autotune.space.search_space import SearchSpace

__all__ = ["enqueue_recipes"]


def _params(config: dict, space: SearchSpace) -> dict | None:
    """The recipe's configuration as this space's parameters (by Optuna's names, see SearchSpace.trial_params);
    None when the space cannot express it. Knobs a recipe predates take their defaults."""
    try:
        deploy = DeployConfig.from_dict(config)
    except (TypeError, ValueError):
        return None
    if deploy.runtime not in space.runtimes:
        return None  # another runtime's recipe: llama.cpp's knobs mean nothing to the engine, and the other way
    config = {**deploy.to_dict(), "runtime": deploy.runtime}
    params: dict = {}
    for dim in space.dimensions:
        if not dim.applies(params):
            continue
        value = config.get(dim.name)
        if dim.name == "layers_per_subgraph" and value == 0:
            value = "all"
        if value not in dim.values_for(params):
            return None
        params[dim.name] = value
    return space.trial_params(params)


def _nearness(hardware: str, other: str) -> tuple[int, int]:
    """Larger is nearer: the same size suffix (cores, "2c"), then the number of shared words of the class name."""
    words, others = hardware.split("-"), other.split("-")
    return int(words[-1] == others[-1]), len(set(words) & set(others))


def recipe_classes(out: str | Path, model: str, hardware: str) -> list[str]:
    """The hardware classes whose recipes may warm-start `hardware`: itself first, then the other classes of its
    backend (the class name's first word: cpu, cuda, npu) that have recipes for the model, nearest first."""
    root = recipe_dir(out, model, hardware).parent
    backend = hardware.split("-")[0]
    others = [p.name for p in root.iterdir() if p.is_dir() and p.name != hardware
              and p.name.split("-")[0] == backend] if root.is_dir() else []
    return [hardware, *sorted(others, key=lambda o: (tuple(-x for x in _nearness(hardware, o)), o))]


def enqueue_recipes(study: optuna.Study, space: SearchSpace, out: str | Path, model: str, hardware: str) -> int:
    """Enqueue each distinct recipe configuration of recipe_classes() that the study has not tried, in that
    order (the study's trial budget bounds how many of them run)."""
    # Waiting (enqueued) trials carry their parameters as fixed_params until they run.
    tried = [t.params or t.system_attrs.get("fixed_params", {}) for t in study.trials]
    count = 0
    for hardware_class in recipe_classes(out, model, hardware):
        count += _enqueue_class(study, space, recipe_dir(out, model, hardware_class), hardware_class, tried)
    return count


def _enqueue_class(study: optuna.Study, space: SearchSpace, folder: Path, hardware_class: str,
                   tried: list[dict]) -> int:
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
        study.enqueue_trial(params, user_attrs={"role": "warm-start", "warm_start_recipe": path.name,
                                                "warm_start_class": hardware_class})
        tried.append(params)
        count += 1
    if count:
        note = class_note(hardware_class)
        log(f"warm start: {count} configurations from the recipes in {folder} are tried first"
            + (f" ({note})" if note else ""))
    return count
