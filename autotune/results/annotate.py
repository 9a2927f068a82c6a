"""What optuna-dashboard shows beyond Optuna's own fields: a markdown note on each Pareto trial (its gain over the
speed baseline, its gate figures, the recipe it became) and the recipe files as downloadable artifacts.

Idempotent: a note is rewritten only when its text changes, and an artifact's id is the digest of its study, trial
and bytes, so annotating twice uploads nothing new; an artifact whose recipe changed is withdrawn."""
from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
import warnings
from pathlib import Path

import optuna
import yaml
from optuna_dashboard import get_note, save_note

from autotune.progress import log
from autotune.recipes.baselines import study_baselines
from autotune.results.front import pareto_trials
from autotune.study.optuna_private import live_trial, set_study_system_attr, study_system_attrs, trial_id

__all__ = ["annotate_study", "artifact_dir", "artifact_store", "recipes_by_trial", "trial_note"]

# Finished trials refuse new system attributes (Optuna's storages check the state), so the metadata of an artifact
# attached to a finished trial goes where optuna-dashboard also looks: the study's system attributes under this
# prefix (its own upload API did the same before optuna.artifacts existed).
_DASHBOARD_PREFIX = "dashboard:artifacts:"


def artifact_dir(storage_url: str) -> Path:
    """Beside an SQLite storage (studies/X.db -> studies/artifacts/); studies/artifacts/ for a server storage."""
    if storage_url.startswith("sqlite:///"):
        return Path(storage_url.removeprefix("sqlite:///")).parent / "artifacts"
    return Path("studies") / "artifacts"


def artifact_store(folder: Path) -> optuna.artifacts.FileSystemArtifactStore:
    folder.mkdir(parents=True, exist_ok=True)
    return optuna.artifacts.FileSystemArtifactStore(str(folder))


def recipes_by_trial(paths: list[Path], study_name: str) -> dict[int, list[Path]]:
    """Recipe files of this study grouped by the trial they froze (read from their provenance, not their names);
    in each group the configuration's own file first, then its picks (best-throughput, ...), whatever order the
    paths came in, so that a note is the same however often it is written."""
    out: dict[int, list[Path]] = {}
    for path in paths:
        try:
            data = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError):
            continue
        prov = data.get("provenance", {}) if isinstance(data, dict) else {}
        if prov.get("study") == study_name and isinstance(prov.get("trial"), int):
            out.setdefault(prov["trial"], []).append(Path(path))
    return {n: sorted(group, key=lambda p: (_is_pick(p), p.name)) for n, group in out.items()}


def _is_pick(path: Path) -> bool:
    """Whether a recipe file is named for a pick rather than for its configuration's digest."""
    return path.stem.startswith(("best-", "smallest-"))


def _ratios(value: float, key: str, baselines: list[dict]) -> str:
    parts = [f"{value / b['bench'][key]:.2f}x {'/'.join(b['names'])}" + (f" ({b['dtype']})" if b.get("dtype") else "")
             for b in baselines if b["bench"].get(key)]
    return f" ({', '.join(parts)})" if parts else ""


def trial_note(study: optuna.Study, trial: optuna.trial.FrozenTrial, recipes: list[Path]) -> str:
    """Markdown for the dashboard: what this point gains over the speed baseline and what it became."""
    bench, gate = trial.user_attrs["bench"], trial.user_attrs.get("gate", {})
    baselines = study_baselines(study.user_attrs)
    simulated = trial.user_attrs.get("source") == "simulated" or study.user_attrs.get("measured") is False
    lines = [f"## Pareto point #{trial.number}: `{trial.user_attrs.get('label', '')}`", ""]
    if simulated:
        lines += ["**Simulated figures** (autotune's analytical model): verify on real hardware.", ""]
    tput, tpot, mem = bench["throughput_tok_s"], bench["tpot_p99_ms"], bench["peak_memory_mb"]
    lines += [
        f"- throughput **{tput:.1f} tok/s**{_ratios(tput, 'throughput_tok_s', baselines)}",
        f"- TPOT p99 **{tpot:.2f} ms**{_ratios(tpot, 'tpot_p99_ms', baselines)}",
        f"- peak memory **{mem:.0f} MB**{_ratios(mem, 'peak_memory_mb', baselines)}",
        f"- TTFT p50 {bench.get('ttft_p50_ms', float('nan')):.0f} ms",
    ]
    if "tie_aware_agreement" in gate:
        lines.append(f"- gate: tie-aware agreement {gate['tie_aware_agreement']:.4f} (raw {gate['raw_agreement']:.4f})"
                     + (f", perplexity {gate['perplexity']:.2f} vs {gate['reference_perplexity']:.2f}"
                        if "perplexity" in gate else ""))
    elif gate.get("measured") is False:
        lines.append("- gate: not measured (simulated); `autotune verify` the recipe on the hardware")
    for b in baselines:
        lines.append(f"\nBaseline {'/'.join(b['names'])}: {b.get('what', 'speed baseline')}, "
                     f"{b['bench']['throughput_tok_s']:.1f} tok/s, TPOT p99 {b['bench']['tpot_p99_ms']:.2f} ms.")
    if recipes:
        names = ", ".join(f"`{p}`" for p in recipes)
        lines += ["", (f"**Recipe:** {names} (download under Artifacts); deploy with "
                       f"`autotune serve {recipes[0]}`.")]
    else:
        lines += ["", "Not exported yet: `autotune export --study " + study.study_name + "`."]
    return "\n".join(lines)


def _save_note(study: optuna.Study, trial: optuna.trial.FrozenTrial, body: str) -> bool:
    # save_note takes a live Trial; one over a finished trial's id only reads, which is all it needs.
    live = live_trial(study, trial)
    if get_note(live) == body:
        return False
    save_note(live, body)
    return True


def _upload(study: optuna.Study, store, trial: optuna.trial.FrozenTrial, path: Path, existing: dict) -> bool:
    data = path.read_bytes()
    digest = hashlib.sha256(f"{study.study_name}:{trial_id(trial)}:{path.name}:".encode() + data).hexdigest()
    artifact_id = str(uuid.UUID(hex=digest[:32]))  # the dashboard's routes accept hex and dashes only
    key = f"{_DASHBOARD_PREFIX}{trial_id(trial)}:{artifact_id}"
    if existing.get(key) not in (None, "null"):
        return False
    for old_key, value in existing.items():  # the same file name with other bytes: withdraw the old version
        if not old_key.startswith(f"{_DASHBOARD_PREFIX}{trial_id(trial)}:"):
            continue
        meta = json.loads(value) if isinstance(value, str) else None
        if isinstance(meta, dict) and meta.get("filename") == path.name:
            set_study_system_attr(study, old_key, json.dumps(None))
            with contextlib.suppress(Exception):  # already gone is fine
                store.remove(meta["artifact_id"])
    with path.open("rb") as f:
        store.write(artifact_id, f)
    meta = {"artifact_id": artifact_id, "filename": path.name, "mimetype": "application/yaml", "encoding": None}
    set_study_system_attr(study, key, json.dumps(meta))
    return True


def annotate_study(study: optuna.Study, recipes: list[Path], folder: Path) -> tuple[int, int]:
    """Note every Pareto trial and attach its recipe files; returns (notes written, artifacts uploaded)."""
    store = artifact_store(folder)
    grouped = recipes_by_trial(recipes, study.study_name)
    existing = study_system_attrs(study)
    notes = uploads = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        for trial in pareto_trials(study):
            paths = grouped.get(trial.number, [])
            notes += _save_note(study, trial, trial_note(study, trial, paths))
            for path in paths:
                uploads += _upload(study, store, trial, path, existing)
    if notes or uploads:
        log(f"dashboard: {notes} notes written, {uploads} recipe files attached (artifacts in {folder})")
    return notes, uploads
