"""A study's Pareto front written as recipes: one per point, named by its configuration's digest, plus the named
picks; dashboard notes and recipe files attached to the study on the way."""
from __future__ import annotations

from pathlib import Path

import optuna
import yaml

from autotune.config.deploy import DeployConfig
from autotune.progress import log
from autotune.recipes.recipe import build_recipe, recipe_dir, write_recipe
from autotune.results.annotate import annotate_study, artifact_dir
from autotune.results.front import exportable, front_picks, pareto_trials
from autotune.study.optuna_private import storage_url as storage_url_of

__all__ = ["write_recipes"]



def write_recipes(study: optuna.Study, out: str | Path, storage_url: str, key: bytes | None = None) -> list[Path]:
    """One recipe per Pareto point, named by its configuration's digest, plus the named picks; signed with `key`
    where one is given (recipes/signature.py).

    Idempotent: unchanged recipes keep their bytes; recipes of this study that left the front are removed."""
    trials = [t for t in pareto_trials(study) if exportable(t)]
    if not trials:
        return []
    folder = recipe_dir(out, study.user_attrs["model"], study.user_attrs["hardware"]["hardware"])
    picks = front_picks(trials)
    written = []
    for t in trials:
        recipe = build_recipe(study, t, storage_url, picks[t.number])
        path = folder / f"{DeployConfig.from_dict(t.user_attrs['config']).digest()}.yaml"
        write_recipe(path, recipe, key)
        written.append(path)
        for name in picks[t.number]:
            write_recipe(folder / f"{name}.yaml", recipe, key)
            written.append(folder / f"{name}.yaml")
    _remove_stale(folder, study.study_name, set(written))
    _annotate(study, written, storage_url)
    return written


def _annotate(study: optuna.Study, written: list[Path], storage_url: str) -> None:
    """Notes and recipe files for optuna-dashboard; best effort: the recipes are the result, this is a view."""
    try:
        annotate_study(study, written, artifact_dir(storage_url_of(study, storage_url)))
    except Exception as exc:  # noqa: BLE001 - a missing optional package or a read-only folder must not fail export
        log(f"dashboard notes not written: {type(exc).__name__}: {exc}")


def _remove_stale(folder: Path, study_name: str, keep: set[Path]) -> None:
    for path in folder.glob("*.yaml"):
        if path in keep or path.name.endswith(".measured.yaml"):
            continue
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict) and data.get("provenance", {}).get("study") == study_name:
            path.unlink()
