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

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import optuna  # noqa: E402

from autotune.backends import get_backend  # noqa: E402
from autotune.config.deploy import DeployConfig  # noqa: E402
from autotune.config.workload import Workload  # noqa: E402
from autotune.recipes.baselines import study_baselines  # noqa: E402
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
    parser.add_argument("--batch", type=int, default=None, help="measure the best at this batch size instead of its own")
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
    config = DeployConfig.from_dict(best.user_attrs["config"])
    if args.batch:
        config = dataclasses.replace(config, batch_size=args.batch)
    workload = Workload(**study.user_attrs["workload"])
    backend = get_backend("cpu")
    common = dict(model=study.user_attrs["model"], workload=workload.to_dict(), repeats=3)
    # One measurement per distinct baseline precision: (label, dtype, batch).
    baselines = [(("/".join(b["names"])), b.get("dtype") or "auto", b.get("batch_size") or 8)
                 for b in study_baselines(study.user_attrs)]
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
    print(f"machine: {fp['cpu']}, {fp['cores']} cores, ISA level {fp['isa_level']} (flags: "
          f"{' '.join(fp['isa_flags']) or 'none of note'}{'; caps ' + str(fp['isa_caps']) if 'isa_caps' in fp else ''})"
          f", class {fp['hardware']}")
    print(f"study {args.study}: {len(study.trials)} trials, search {search_s / 60:.1f} min; best gate-passing "
          f"configuration (trial #{best.number}) re-measured against the baselines, {args.rounds} alternating "
          f"rounds, medians")
    print(f"workload: {workload.num_requests} requests, prompts {workload.prompt_min}-{workload.prompt_max} tokens, "
          f"{workload.output_tokens} new tokens each, offline")
    heads = [f"transformers generate {dtype} ({label}), batch {batch}" for label, dtype, batch in baselines]
    print(f"| figure | {' | '.join(heads)} | best: {config.label()} | " + " | ".join(f"ratio to {label}"
                                                                                    for label, _, _ in baselines) + " |")
    print("|---" * (2 + 2 * len(baselines)) + "|")
    for name, key, fmt in rows:
        c = med("candidate", key)
        cells = [fmt.format(med(label, key)) for label, _, _ in baselines]
        ratios = [f"{c / med(label, key):.2f}x" for label, _, _ in baselines]
        print(f"| {name} | {' | '.join(cells)} | {fmt.format(c)} | {' | '.join(ratios)} |")
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
