"""The Pareto front of a study as a table, each point read against the speed baseline."""
from __future__ import annotations

import optuna

from autotune.config.deploy import DeployConfig
from autotune.results.front import pareto_trials

__all__ = ["pareto_table", "study_summary"]


def _baseline_tput(study: optuna.Study) -> float | None:
    base = study.user_attrs.get("speed_baseline", {}).get("bench")
    return base["throughput_tok_s"] if base else None


def _agreement(gate: dict) -> str:
    if gate.get("measured") is False:
        return "n/m"  # simulated: the gate was not measured
    return f"{gate['tie_aware_agreement']:.4f}" if "tie_aware_agreement" in gate else "-"


def _peak_mb(bench: dict) -> str:
    # Marked where the high-water mark could not be reset before the runs (benchmark/bench.py): that figure also
    # holds loading and building, so it is not comparable with the others.
    mark = "*" if bench.get("peak_memory_reset") is False else " "
    return f"{bench['peak_memory_mb']:.0f}{mark}"


_PEAK_FOOTNOTE = "* peak memory not reset before the runs: it includes loading and building (see bench.peak_memory_note)"


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
                     f"{_peak_mb(b):>9}{_agreement(g):>7}")
    if not trials:
        lines.append("(no feasible, gate-passing trial yet)")
    baseline = study.user_attrs.get("speed_baseline")
    if baseline:
        b = baseline["bench"]
        lines.append(f"baseline: {baseline['what']}, batch {baseline['batch_size']}: {b['throughput_tok_s']:.1f} tok/s, "
                     f"TTFT p50 {b['ttft_p50_ms']:.0f} ms, TPOT p99 {b['tpot_p99_ms']:.1f} ms, "
                     f"{_peak_mb(b).rstrip()} MB")
    benches = [t.user_attrs["bench"] for t in trials] + ([baseline["bench"]] if baseline else [])
    if any(b.get("peak_memory_reset") is False for b in benches):
        lines.append(_PEAK_FOOTNOTE)
    return "\n".join(lines)


def study_summary(study: optuna.Study) -> str:
    counts: dict[str, int] = {}
    for t in study.trials:
        key = "gated" if t.state == optuna.trial.TrialState.PRUNED else t.state.name.lower()
        counts[key] = counts.get(key, 0) + 1
    return f"study {study.study_name}: {len(study.trials)} trials (" + ", ".join(
        f"{v} {k}" for k, v in sorted(counts.items())) + ")"
