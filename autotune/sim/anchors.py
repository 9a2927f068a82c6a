"""Measured figures to calibrate and check the simulator against: the published ones (hardware/anchors/) and
this project's own CPU trials, read from a study storage."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.errors import UserInputError
from autotune.models.registry import resolve_model
from autotune.sim.fit import Anchor
from autotune.sim.hardware import HARDWARE_DIR

__all__ = ["AnchorGroup", "published_groups", "borrowed", "cpu_trial_anchors", "PUBLISHED"]

PUBLISHED = HARDWARE_DIR / "anchors" / "published.yaml"
CPU_METRICS = ("throughput_tok_s", "tpot_p50_ms", "ttft_p50_ms", "peak_memory_mb")


@dataclass(frozen=True, slots=True)
class AnchorGroup:
    profile: str
    source: str
    assumed: str
    fit: tuple[str, ...]
    anchors: tuple[Anchor, ...]


def _config(params: dict) -> DeployConfig:
    return DeployConfig.from_params(params)


def published_groups(path: Path = PUBLISHED) -> list[AnchorGroup]:
    data = yaml.safe_load(path.read_text())
    groups = []
    for g in data["groups"]:
        anchors = []
        for fig in g["figures"]:
            spec, config, workload = resolve_model(fig["model"]), _config(fig["config"]), Workload(**fig["workload"])
            for metric, target in fig["metrics"].items():
                anchors.append(Anchor(spec, config, workload, metric, float(target), g["source"]))
        groups.append(AnchorGroup(g["profile"], g["source"], g.get("assumed", ""), tuple(g["fit"]), tuple(anchors)))
    return groups


def borrowed(path: Path = PUBLISHED) -> dict[str, dict[str, str]]:
    return dict(yaml.safe_load(path.read_text()).get("borrow") or {})


def cpu_trial_anchors(storage: str) -> tuple[list[Anchor], list[str]]:
    """Every completed, non-duplicate trial of every study in `storage` that ran on the CPU backend: its
    configuration, its study's workload and model, and its measured bench figures. Also the study names."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        summaries = optuna.get_all_study_summaries(storage)
    except Exception as exc:  # noqa: BLE001 - any failure to open is the user's URL
        raise UserInputError(f"cannot read the study storage {storage!r}: {exc}") from None
    anchors: list[Anchor] = []
    names = []
    for summary in summaries:
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        attrs = study.user_attrs
        if attrs.get("backend") != "cpu" or "workload" not in attrs:
            continue
        names.append(summary.study_name)
        spec, workload = resolve_model(attrs["model"]), Workload(**attrs["workload"])
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            bench, config = t.user_attrs.get("bench"), t.user_attrs.get("config")
            if not bench or not config or "duplicate_of" in t.user_attrs:
                continue
            for metric in CPU_METRICS:
                if bench.get(metric):
                    anchors.append(Anchor(spec, DeployConfig.from_dict(config), workload, metric, float(bench[metric]),
                                          f"{summary.study_name} trial #{t.number}"))
    return anchors, names
