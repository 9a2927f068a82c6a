"""The Pareto front of a study as a table, each point read against the speed baseline."""
from __future__ import annotations

import optuna

from autotune.config.deploy import DeployConfig
from autotune.recipes.baselines import study_baselines
from autotune.recipes.compute_limit import trial_compute_limit
from autotune.recipes.recipe import holdout_of, holdout_verdict
from autotune.results.front import pareto_trials

__all__ = ["pareto_table", "study_summary"]


def _agreement(gate: dict) -> str:
    if gate.get("measured") is False:
        return "n/m"  # simulated: the gate was not measured
    if "tie_aware_agreement" not in gate:
        return "-"
    # A marginal build on the front is there only by --accept-marginal: the row says so.
    return f"{gate['tie_aware_agreement']:.4f}" + (" marginal" if gate.get("accepted_marginal") else "")


def _held(record: dict | None) -> str:
    """The held-back check's decode agreement (autotune/results/holdout.py): "?" marks a marginal one, "n/r" one
    that could not run, "-" none yet (the search runs it after its trials)."""
    verdict = holdout_verdict(record)
    if verdict is None:
        return "-"
    if verdict == "not run":
        return "n/r"
    return f"{record['decode_agreement']:.4f}" + ("?" if verdict == "marginal" else "")


def _peak_mb(bench: dict) -> str:
    # Marked where the high-water mark could not be reset before the runs (benchmark/bench.py): that figure also
    # holds loading and building, so it is not comparable with the others.
    mark = "*" if bench.get("peak_memory_reset") is False else " "
    return f"{bench['peak_memory_mb']:.0f}{mark}"


_PEAK_FOOTNOTE = ("* peak memory not reset before the runs: it includes loading and building (see "
                  "bench.peak_memory_note)")


def _limit(attrs: dict, trial_attrs: dict) -> str:
    limit = trial_compute_limit(attrs, trial_attrs)
    return f"{limit['fraction']:.2f}" if limit else "-"


def pareto_table(study: optuna.Study) -> str:
    """The front, with the gain in throughput over each speed baseline (one column per distinct measurement)."""
    trials = pareto_trials(study)
    baselines = study_baselines(study.user_attrs)
    gain_heads = [f"x{b.get('dtype') or 'base'}" for b in baselines] or ["gain"]
    slo = study.user_attrs.get("slo")
    header = (f"{'trial':>5}  {'configuration':<50} " + (f"{'goodput':>9} " if slo else "") + f"{'tok/s':>7} "
              + " ".join(f"{h:>7}" for h in gain_heads)
              + f" {'TTFT p50':>9} {'TPOT p99':>9} {'peak MB':>8} {'agree':>7} {'held':>7} {'runs':>4} {'limit':>5}")
    lines = [header, "-" * len(header)]
    for t in trials:
        b, g = t.user_attrs["bench"], t.user_attrs.get("gate", {})
        cells = [f"{b['throughput_tok_s'] / base['bench']['throughput_tok_s']:.2f}x" for base in baselines] or ["-"]
        runs = b.get("repeats")
        config = DeployConfig.from_dict(t.user_attrs["config"])
        # The concurrency that ran, where the pool's pages held fewer sequences than the batch size.
        ran = b.get("concurrency_peak")
        label = config.label() + (f" (ran {ran})" if ran is not None and ran < config.batch_size else "")
        goodput = f"{b.get('goodput_req_s', 0.0):>5.2f}r/s " if slo else ""
        lines.append(f"{t.number:>5}  {label:<50} {goodput}"
                     f"{b['throughput_tok_s']:>7.1f} " + " ".join(f"{c:>7}" for c in cells)
                     + f" {b['ttft_p50_ms']:>7.0f}ms {b['tpot_p99_ms']:>7.1f}ms {_peak_mb(b):>9}{_agreement(g):>7} "
                     f"{_held(holdout_of(study, t)):>7} "
                     f"{'-' if runs is None else runs:>4} {_limit(study.user_attrs, t.user_attrs):>5}")
    if not trials:
        lines.append("(no feasible, gate-passing trial yet)")
    if slo:
        lines.append(f"goodput: requests per second served with {slo['attainment']:.0%} of them within TTFT "
                     f"{slo['ttft_ms']:g} ms and TPOT {slo['tpot_ms']:g} ms (Poisson arrivals; the rates tried are "
                     "on each trial's `goodput` attribute)")
    for base in baselines:
        b = base["bench"]
        lines.append(f"baseline {'/'.join(base['names'])}: {base.get('what', 'speed baseline')}, batch "
                     f"{base.get('batch_size', '?')}: {b['throughput_tok_s']:.1f} tok/s, TTFT p50 "
                     f"{b['ttft_p50_ms']:.0f} ms, TPOT p99 {b['tpot_p99_ms']:.1f} ms, {_peak_mb(b).rstrip()} MB")
    if any(holdout_of(study, t) is not None for t in trials):
        lines.append("held: decode agreement on held-back prompts no trial's gate read, checked before the recipes "
                     "were written (? undecided at its cap, n/r could not run)")
    if trials and any(_limit(study.user_attrs, t.user_attrs) != "-" for t in trials):
        lines.append("limit: the decode's compute rate (model FLOPs per output token x tok/s) over the probe's "
                     "matmul rate at that batch x the threads: this machine's arithmetic ceiling")
    if any(t.user_attrs["bench"].get("repeats", 2) <= 1 for t in trials):
        lines.append("runs: timed runs of the whole workload; a point of one run has no known spread")
    benches = [t.user_attrs["bench"] for t in trials] + [base["bench"] for base in baselines]
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
