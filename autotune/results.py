"""The Pareto front of a study as a table, each point read against the speed baseline."""
from __future__ import annotations

from pathlib import Path

import optuna

from autotune.config import DeployConfig
from autotune.recipe import build_recipe, recipe_dir, write_recipe

__all__ = ["pareto_trials", "pareto_table", "write_recipes", "study_summary"]

_PICKS = (("best-throughput", 0, max), ("best-latency", 1, min), ("smallest-memory", 2, min))


def pareto_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Feasible, gate-passing, non-dominated trials (Optuna's best_trials honours the constraints)."""
    best = [t for t in study.best_trials if "duplicate_of" not in t.user_attrs]
    return sorted(best, key=lambda t: -t.values[0])


def _baseline_tput(study: optuna.Study) -> float | None:
    base = study.user_attrs.get("speed_baseline", {}).get("bench")
    return base["throughput_tok_s"] if base else None


def _agreement(gate: dict) -> str:
    if gate.get("measured") is False:
        return "n/m"  # simulated: the gate was not measured
    return f"{gate['tie_aware_agreement']:.4f}" if "tie_aware_agreement" in gate else "-"


def pareto_table(study: optuna.Study) -> str:
    trials = pareto_trials(study)
    base = _baseline_tput(study)
    header = (f"{'trial':>5}  {'configuration':<46} {'tok/s':>7} {'gain':>6} {'TTFT p50':>9} {'TPOT p99':>9} "
              f"{'peak MB':>8} {'agree':>7}")
    lines = [header, "-" * len(header)]
    for t in trials:
        b, g = t.user_attrs["bench"], t.user_attrs.get("gate", {})
        gain = f"{b['throughput_tok_s'] / base:.2f}x" if base else "-"
        lines.append(f"{t.number:>5}  {DeployConfig(**t.user_attrs['config']).label():<46} "
                     f"{b['throughput_tok_s']:>7.1f} {gain:>6} {b['ttft_p50_ms']:>7.0f}ms {b['tpot_p99_ms']:>7.1f}ms "
                     f"{b['peak_memory_mb']:>8.0f} {_agreement(g):>7}")
    if not trials:
        lines.append("(no feasible, gate-passing trial yet)")
    baseline = study.user_attrs.get("speed_baseline")
    if baseline:
        b = baseline["bench"]
        lines.append(f"baseline: {baseline['what']}, batch {baseline['batch_size']}: {b['throughput_tok_s']:.1f} tok/s, "
                     f"TTFT p50 {b['ttft_p50_ms']:.0f} ms, TPOT p99 {b['tpot_p99_ms']:.1f} ms, "
                     f"{b['peak_memory_mb']:.0f} MB")
    return "\n".join(lines)


def study_summary(study: optuna.Study) -> str:
    counts: dict[str, int] = {}
    for t in study.trials:
        key = "gated" if t.state == optuna.trial.TrialState.PRUNED else t.state.name.lower()
        counts[key] = counts.get(key, 0) + 1
    return f"study {study.study_name}: {len(study.trials)} trials (" + ", ".join(
        f"{v} {k}" for k, v in sorted(counts.items())) + ")"


def _exportable(trial: optuna.trial.FrozenTrial) -> bool:
    """Belt and braces over best_trials: complete, benchmarked, gate passed, every constraint met."""
    gate = trial.user_attrs.get("gate")
    return (trial.state == optuna.trial.TrialState.COMPLETE and "bench" in trial.user_attrs
            and (gate is None or bool(gate.get("passed")) or gate.get("measured") is False)
            and all(v <= 0 for v in trial.constraints.values()))


def write_recipes(study: optuna.Study, out: str | Path, storage_url: str) -> list[Path]:
    """One recipe per Pareto point, named by its configuration's digest, plus the named picks.

    Idempotent: unchanged recipes keep their bytes; recipes of this study that left the front are removed."""
    trials = [t for t in pareto_trials(study) if _exportable(t)]
    if not trials:
        return []
    folder = recipe_dir(out, study.user_attrs["model"], study.user_attrs["hardware"]["hardware"])
    picks: dict[int, list[str]] = {t.number: [] for t in trials}
    for name, index, choose in _PICKS:
        picks[choose(trials, key=lambda t: t.values[index]).number].append(name)
    written = []
    for t in trials:
        recipe = build_recipe(study, t, storage_url, picks[t.number])
        path = folder / f"{DeployConfig(**t.user_attrs['config']).digest()}.yaml"
        write_recipe(path, recipe)
        written.append(path)
        for name in picks[t.number]:
            write_recipe(folder / f"{name}.yaml", recipe)
            written.append(folder / f"{name}.yaml")
    _remove_stale(folder, study.study_name, set(written))
    _annotate(study, written, storage_url)
    return written


def _annotate(study: optuna.Study, written: list[Path], storage_url: str) -> None:
    """Notes and recipe files for optuna-dashboard; best effort: the recipes are the result, this is a view."""
    from autotune.annotate import annotate_study, artifact_dir, study_storage_url
    from autotune.progress import log

    try:
        annotate_study(study, written, artifact_dir(study_storage_url(study, storage_url)))
    except Exception as exc:  # noqa: BLE001 - a missing optional package or a read-only folder must not fail export
        log(f"dashboard notes not written: {type(exc).__name__}: {exc}")


def _remove_stale(folder: Path, study_name: str, keep: set[Path]) -> None:
    import yaml

    for path in folder.glob("*.yaml"):
        if path in keep or path.name.endswith(".measured.yaml"):
            continue
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict) and data.get("provenance", {}).get("study") == study_name:
            path.unlink()
