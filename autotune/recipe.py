"""Frozen recipes: the self-describing result of a study, one YAML file per chosen configuration."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import optuna
import yaml

from autotune import __version__
from autotune.storage import redact

__all__ = ["SCHEMA_VERSION", "build_recipe", "write_recipe", "load_recipe", "recipe_dir"]

SCHEMA_VERSION = 1


def recipe_dir(out: str | Path, model: str, hardware: str) -> Path:
    return Path(out) / model / hardware


def build_recipe(study: optuna.Study, trial: optuna.trial.FrozenTrial, storage_url: str, picks: list[str]) -> dict:
    attrs = study.user_attrs
    bench = trial.user_attrs["bench"]
    baseline = attrs.get("speed_baseline", {}).get("bench")
    metrics = {k: bench[k] for k in ("throughput_tok_s", "throughput_min", "throughput_max", "ttft_p50_ms",
                                     "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "peak_memory_mb",
                                     "kv_reserved_peak_mb", "repeats")}
    recipe = {
        "schema_version": SCHEMA_VERSION,
        "kind": "autotune-recipe",
        "model": {"name": attrs["model"], "source": attrs["model_source"], "checksum": attrs["model_checksum"]},
        "backend": attrs["backend"],
        "hardware": attrs["hardware"],
        "software": trial.user_attrs.get("versions", {}),
        "configuration": trial.user_attrs["config"],
        "threads": trial.user_attrs.get("threads"),
        "workload": attrs["workload"],
        "metrics": {"source": "measured" if attrs.get("measured", True) else "simulated", **metrics,
                    "build_s": trial.user_attrs.get("build_s")},
        "gate": trial.user_attrs.get("gate"),
        "baseline": None if baseline is None else {
            "what": attrs["speed_baseline"]["what"], "throughput_tok_s": baseline["throughput_tok_s"],
            "tpot_p99_ms": baseline["tpot_p99_ms"], "peak_memory_mb": baseline["peak_memory_mb"],
            "throughput_gain": bench["throughput_tok_s"] / baseline["throughput_tok_s"],
        },
        "picks": picks,
        "provenance": {"study": study.study_name, "storage": redact(storage_url), "trial": trial.number,
                       "date": (trial.datetime_complete or dt.datetime.now()).isoformat(timespec="seconds"),
                       "autotune": __version__},
    }
    recipe["deploy"] = {"command": "autotune serve RECIPE", "env": {"HF_HUB_OFFLINE": "1"}}
    return recipe


def write_recipe(path: Path, recipe: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    recipe = {**recipe, "deploy": {**recipe["deploy"], "command": f"autotune serve {path}"}}
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))


def load_recipe(path: str | Path) -> dict:
    return yaml.safe_load(Path(path).read_text())
