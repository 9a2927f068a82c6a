"""Run the default search, then measure its best gate-passing configuration side by side with both speed baselines
the study measured (transformers generate, eager, batch 8: as a user loads the model, dtype="auto", and at the
device's fastest plain precision) in this one run, and print the table with the CPU model and ISA.

    python scripts/bench_search.py [--trials N] [--rounds 2] [--study bench-search] [--no-warm-start] [--batch 8]

Each measurement is its own isolated job (fresh process, warm-up, timed runs, medians); baselines and candidate
alternate, `--rounds` times, so that drifts of the machine hit all alike. The ratios are of medians. The candidate
runs at its own batch size (`--batch` sets another). It also prints when, counted from the start of the search
command, the best throughput found so far first reached 90% and 95% of the search's final best: how soon a user
with less time would have had most of the gain. Run it with ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 in
the environment to see an AVX2 machine's search on an AVX-512 one (every process inherits them)."""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import optuna  # noqa: E402
from bench_record import compare, machine, spread, write  # noqa: E402

from autotune.backends import get_backend  # noqa: E402
from autotune.config.deploy import DeployConfig  # noqa: E402
from autotune.config.workload import Workload  # noqa: E402
from autotune.recipes.baselines import study_baselines  # noqa: E402
from autotune.recipes.compute_limit import trial_compute_limit  # noqa: E402
from autotune.results.front import exportable, pareto_trials  # noqa: E402
from autotune.trial.job import Job, JobKind  # noqa: E402


def _time_to_best(study: optuna.Study, started_at: datetime.datetime) -> list[str]:
    """When the best gate-passing throughput so far first reached 90% and 95% of the final best, in minutes
    since the search command started (conversion, reference and speed baseline included)."""
    done = sorted((t for t in pareto_candidates(study)), key=lambda t: t.datetime_complete)
    if not done:
        return []
    final = max(t.values[0] for t in done)
    lines = []
    for share in (0.90, 0.95):
        first = next(t for t in done if t.values[0] >= share * final)
        minutes = (first.datetime_complete - started_at).total_seconds() / 60
        lines.append(f"best so far first reached {share:.0%} of the final best ({final:.1f} tok/s) at "
                     f"{minutes:.1f} min, with trial #{first.number} ({first.values[0]:.1f} tok/s)")
    return lines


def pareto_candidates(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Complete, feasible, gate-passing, benchmarked trials: what the front is chosen from."""
    return [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if exportable(t) and "duplicate_of" not in t.user_attrs]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=None, help="default: the search's own default")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--study", default=f"bench-search-{int(time.time())}")
    parser.add_argument("--storage", default="sqlite:///studies/bench-search.db")
    parser.add_argument("--skip-search", action="store_true", help="measure an existing study's best")
    parser.add_argument("--no-warm-start", action="store_true", help="pass --no-warm-start to the search")
    parser.add_argument("--model", default=None, help="pass --model to the search (default: the search's own)")
    parser.add_argument("--batch", type=int, default=None,
                        help="measure the best at this batch size instead of its own")
    parser.add_argument("--data", default=None,
                        help="name of the JSON record under docs/data/ (default bench_search-<model>-<hardware class>)")
    args = parser.parse_args()
    started = time.perf_counter()
    started_at = datetime.datetime.now()
    if not args.skip_search:
        cmd = [sys.executable, "-m", "autotune.cli", "search", "--study", args.study, "--storage", args.storage,
               "--out", "recipes", *(["--trials", str(args.trials)] if args.trials else []),
               *(["--no-warm-start"] if args.no_warm_start else []), *(["--model", args.model] if args.model else [])]
        print("$", " ".join(cmd[2:]), flush=True)
        subprocess.run(cmd, check=True)
    search_s = time.perf_counter() - started
    study = optuna.load_study(study_name=args.study, storage=args.storage)
    front = pareto_trials(study)
    if not front:
        print("no gate-passing configuration on the front")
        return 1
    best = front[0]  # highest throughput
    config = DeployConfig.from_dict(best.user_attrs["config"])
    if args.batch:
        config = dataclasses.replace(config, batch_size=args.batch)
    workload = Workload(**study.user_attrs["workload"])
    backend = get_backend("cpu")
    common = dict(model=study.user_attrs["model"], workload=workload.to_dict(), repeats=3)
    # One measurement per distinct baseline precision: (label, dtype, batch); and the as-loaded baseline again at
    # the candidate's batch size, so that what the search found beyond batching is visible.
    baselines = [(("/".join(b["names"])), b.get("dtype") or "auto", b.get("batch_size") or 8)
                 for b in study_baselines(study.user_attrs)]
    if baselines and config.batch_size != baselines[0][2]:
        label, dtype, _ = baselines[0]
        baselines.append((f"{label.split('/')[0]}@batch{config.batch_size}", dtype, config.batch_size))
    runs: dict[str, list[dict]] = {label: [] for label, _, _ in baselines}
    runs["candidate"] = []
    for r in range(args.rounds):
        jobs = [(label, Job(kind=JobKind.HF_BASELINE, baseline_batch=batch, baseline_dtype=dtype, **common))
                for label, dtype, batch in baselines]
        jobs.append(("candidate", Job(kind=JobKind.TRIAL, config=config.to_dict(), threads=config.device_power,
                                      gate=best.user_attrs.get("gate"), **common)))
        for label, job in jobs if r % 2 == 0 else reversed(jobs):
            print(f"round {r + 1}/{args.rounds}: {label}", flush=True)
            result = backend.run(job, 3600)
            if not result.ok or result.bench is None:
                print("failed:", result.reason, *(result.log_tail or [])[-5:], sep="\n")
                return 1
            runs[label].append(result.bench)

    def med(label, key):
        return statistics.median(r[key] for r in runs[label])

    rows = [("throughput (tok/s)", "throughput_tok_s", "{:.1f}"), ("TTFT p50 (ms)", "ttft_p50_ms", "{:.0f}"),
            ("TPOT p50 (ms)", "tpot_p50_ms", "{:.1f}"), ("TPOT p99 (ms)", "tpot_p99_ms", "{:.1f}"),
            ("peak memory (MB)", "peak_memory_mb", "{:.0f}")]
    fp = backend.fingerprint()
    print()
    print(f"machine: {fp['cpu']} ({fp.get('microarch', '?')}), {fp['cores']} cores, ISA level {fp['isa_level']} "
          f"(flags: {' '.join(fp['isa_flags']) or 'none of note'}"
          f"{'; caps ' + str(fp['isa_caps']) if 'isa_caps' in fp else ''}), class {fp['hardware']}")
    print(f"study {args.study}: {len(study.trials)} trials, search {search_s / 60:.1f} min; best gate-passing "
          f"configuration (trial #{best.number}) re-measured against the baselines, {args.rounds} alternating "
          f"rounds, medians")
    print(f"workload: {workload.num_requests} requests, prompts {workload.prompt_min}-{workload.prompt_max} tokens, "
          f"{workload.output_tokens} new tokens each, offline")
    heads = [f"transformers generate {dtype} ({label}), batch {batch}" for label, dtype, batch in baselines]
    ratio_heads = " | ".join(f"ratio to {label}" for label, _, _ in baselines)
    print(f"| figure | {' | '.join(heads)} | best: {config.label()} | {ratio_heads} |")
    print("|---" * (2 + 2 * len(baselines)) + "|")
    for name, key, fmt in rows:
        c = med("candidate", key)
        cells = [fmt.format(med(label, key)) for label, _, _ in baselines]
        ratios = [f"{c / med(label, key):.2f}x" for label, _, _ in baselines]
        print(f"| {name} | {' | '.join(cells)} | {fmt.format(c)} | {' | '.join(ratios)} |")
    tput = {label: [r["throughput_tok_s"] for r in bench] for label, bench in runs.items()}
    for label, _, _ in baselines:
        print(f"throughput of the best against {label}: {compare(tput['candidate'], tput[label])} "
              f"(rounds {min(tput['candidate']):.1f}-{max(tput['candidate']):.1f} against "
              f"{min(tput[label]):.1f}-{max(tput[label]):.1f})")
    reached = _time_to_best(study, started_at) if not args.skip_search else []
    for line in reached:
        print(line)
    gate = best.user_attrs["gate"]
    print(f"gate of the candidate: tie-aware agreement {gate['tie_aware_agreement']:.4f}, raw "
          f"{gate['raw_agreement']:.4f}, perplexity {gate['perplexity']:.2f} (reference "
          f"{gate['reference_perplexity']:.2f})")
    limit = trial_compute_limit(study.user_attrs, {**best.user_attrs, "bench": {
        "throughput_tok_s": med("candidate", "throughput_tok_s")}})
    if limit:
        print(f"compute limit of the best: {limit['fraction']:.2f} ({limit['achieved_gflops']:.1f} of "
              f"{limit['ceiling_gflops']:.1f} GFLOP/s: {limit['how']})")
    model = Path(study.user_attrs["model"]).name
    write(args.data or f"bench_search-{model}-{fp['hardware']}", {
        "machine": machine(fp), "study": args.study, "search": _search_record(study, search_s),
        "workload": workload.to_dict(), "best": {"trial": best.number, "label": config.label(),
                                                 "config": config.to_dict(), "gate": gate, "compute_limit": limit},
        "baselines": [{"label": label, "dtype": dtype, "batch_size": batch} for label, dtype, batch in baselines],
        "rounds": runs, "throughput": {label: spread(values) for label, values in tput.items()},
        "ratios": {label: round(med("candidate", "throughput_tok_s") / med(label, "throughput_tok_s"), 3)
                   for label, _, _ in baselines},
        "order": {label: compare(tput["candidate"], tput[label]) for label, _, _ in baselines},
        "time_to_best": reached})
    return 0


def _search_record(study: optuna.Study, search_s: float) -> dict:
    """What the search did with its budget: how it stopped, the share of the budget used, the fusion levels and
    schemes it measured, repeats it did not pay for, how far its cost predictions were off."""
    counted = [t for t in study.trials if t.state.is_finished() and "duplicate_of" not in t.user_attrs
               and not t.user_attrs.get("not_run")]
    configs = [t.user_attrs.get("config") or {} for t in counted]
    return {"seconds": round(search_s, 1), "stopped_by": study.user_attrs.get("stopped_by"),
            "trials": len(counted), "not_run": sum(bool(t.user_attrs.get("not_run")) for t in study.trials),
            "repeats_skipped": study.user_attrs.get("repeats_skipped", 0),
            "fusion_levels": sorted({c.get("fusion_level") for c in configs if c.get("fusion_level")}),
            "quant_schemes": sorted({c.get("quant") for c in configs if c.get("quant")}),
            "cost_model_error": study.user_attrs.get("cost_model_error"),
            "trial_labels": [t.user_attrs.get("label") for t in counted]}


if __name__ == "__main__":
    sys.exit(main())
