"""Run the default search, then measure its best gate-passing configuration at batch 8 side by side with the
speed baseline (transformers generate, bf16, eager, batch 8) in this one run, and print the table.

    python scripts/bench_search.py [--trials N] [--rounds 2] [--study bench-search] [--no-warm-start]

Each measurement is its own isolated job (fresh process, warm-up, repeats, medians); baseline and candidate
alternate, `--rounds` times, so that drifts of the machine hit both alike. The ratio is of medians. It also prints
when, counted from the start of the search command, the best throughput found so far first reached 90% and 95%
of the search's final best: how soon a user with less time would have had most of the gain."""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import optuna  # noqa: E402

from autotune.backends import get_backend  # noqa: E402
from autotune.config.deploy import DeployConfig  # noqa: E402
from autotune.config.workload import Workload  # noqa: E402
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
    args = parser.parse_args()
    started = time.perf_counter()
    started_at = datetime.datetime.now()
    if not args.skip_search:
        cmd = [sys.executable, "-m", "autotune.cli", "search", "--study", args.study, "--storage", args.storage,
               "--out", "recipes", *(["--trials", str(args.trials)] if args.trials else []),
               *(["--no-warm-start"] if args.no_warm_start else [])]
        print("$", " ".join(cmd[2:]), flush=True)
        subprocess.run(cmd, check=True)
    search_s = time.perf_counter() - started
    study = optuna.load_study(study_name=args.study, storage=args.storage)
    front = pareto_trials(study)
    if not front:
        print("no gate-passing configuration on the front")
        return 1
    best = front[0]  # highest throughput
    config = dataclasses.replace(DeployConfig(**best.user_attrs["config"]), batch_size=8)
    workload = Workload(**study.user_attrs["workload"])
    backend = get_backend("cpu")
    common = dict(model=study.user_attrs["model"], workload=workload.to_dict(), repeats=3)
    base_runs, cand_runs = [], []
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}: baseline", flush=True)
        base = backend.run(Job(kind=JobKind.HF_BASELINE, baseline_batch=8, **common), 1800)
        print(f"round {r + 1}/{args.rounds}: {config.label()}", flush=True)
        gate = best.user_attrs.get("gate")
        cand = backend.run(Job(kind=JobKind.TRIAL, config=config.to_dict(), threads=config.device_power, gate=gate,
                               **common), 1800)
        for result in (base, cand):
            if not result.ok:
                print("failed:", result.reason, *(result.log_tail or [])[-5:], sep="\n")
                return 1
        base_runs.append(base.bench)
        cand_runs.append(cand.bench)

    def med(runs, key):
        return statistics.median(r[key] for r in runs)

    rows = [("throughput (tok/s)", "throughput_tok_s", "{:.1f}"), ("TTFT p50 (ms)", "ttft_p50_ms", "{:.0f}"),
            ("TPOT p50 (ms)", "tpot_p50_ms", "{:.1f}"), ("TPOT p99 (ms)", "tpot_p99_ms", "{:.1f}"),
            ("peak memory (MB)", "peak_memory_mb", "{:.0f}")]
    print()
    print(f"study {args.study}: {len(study.trials)} trials, search {search_s / 60:.1f} min; best gate-passing "
          f"configuration (trial #{best.number}) re-measured at batch 8 against the baseline, "
          f"{args.rounds} alternating rounds x 3 repeats, medians")
    print(f"workload: {workload.num_requests} requests, prompts {workload.prompt_min}-{workload.prompt_max} tokens, "
          f"{workload.output_tokens} new tokens each, offline")
    print(f"| figure | baseline: transformers generate, bf16 eager, batch 8 | {config.label()} | ratio |")
    print("|---|---|---|---|")
    for name, key, fmt in rows:
        b, c = med(base_runs, key), med(cand_runs, key)
        print(f"| {name} | {fmt.format(b)} | {fmt.format(c)} | {c / b:.2f}x |")
    if not args.skip_search:
        for line in _time_to_best(study, started_at):
            print(line)
    gate = best.user_attrs["gate"]
    print(f"gate of the candidate: tie-aware agreement {gate['tie_aware_agreement']:.4f}, raw "
          f"{gate['raw_agreement']:.4f}, perplexity {gate['perplexity']:.2f} (reference "
          f"{gate['reference_perplexity']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
