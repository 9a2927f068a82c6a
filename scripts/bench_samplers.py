"""Which sampler should `autotune search` use? Measured on the simulator, where the whole grid is cheap.

    python scripts/bench_samplers.py [--model llama-7b] [--hardware ascend910] [--seeds 5]

Enumerates every configuration of the (backend-adapted) default space, predicts each, and takes the exact
Pareto front of (throughput max, TPOT p99 min, peak memory min) over the feasible ones and its hypervolume.
Then runs each sampler of autotune.study.loop.make_sampler through the same ask/tell loop as a study (baseline
enqueued first; infeasible configurations are failed trials; repeats count as trials, as they do for a user's
--trials) and prints the hypervolume reached after 25, 50, 100 and 200 trials as a fraction of the exact one,
median over the seeds. Objectives are normalised by the exact front's range; the reference point is 1.1 x the front's nadir.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from optuna._hypervolume import compute_hypervolume  # noqa: E402

from autotune.backends.sim import SimBackend  # noqa: E402
from autotune.config.deploy import DeployConfig  # noqa: E402
from autotune.config.workload import Workload  # noqa: E402
from autotune.models.registry import resolve_model  # noqa: E402
from autotune.sim.predict import predict  # noqa: E402
from autotune.space.search_space import SearchSpace, load_space  # noqa: E402
from autotune.study.settings import OBJECTIVES, SAMPLERS, make_sampler  # noqa: E402
from autotune.study.setup import enqueue_baseline  # noqa: E402

CHECKPOINTS = (25, 50, 100, 200)


def losses(figures: dict) -> tuple[float, ...]:
    """Minimisation form of the study's objectives."""
    return tuple(-figures[n] if d == "maximize" else figures[n] for n, d in OBJECTIVES)


class Scorer:
    """Hypervolume in objectives normalised by the exact front (ideal 0, nadir 1), reference point 1.1: what
    counts is how close a sampler gets to the front, not how far it got from the worst configuration."""

    def __init__(self, front: np.ndarray) -> None:
        self.lo, self.hi = front.min(axis=0), front.max(axis=0)
        self.ref = np.full(front.shape[1], 1.1)

    def hv(self, points: list[tuple[float, ...]]) -> float:
        if not points:
            return 0.0
        norm = (np.asarray(points) - self.lo) / np.where(self.hi > self.lo, self.hi - self.lo, 1.0)
        norm = norm[(norm < self.ref).all(axis=1)]
        return compute_hypervolume(norm, self.ref) if len(norm) else 0.0


def run_sampler(name: str, seed: int, space: SearchSpace, table: dict[str, tuple | None], scorer: Scorer,
                trials: int) -> dict[int, tuple[float, int]]:
    sampler = make_sampler(name, seed)
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # make_sampler sets WARNING; GP warns on every trial
    study = optuna.create_study(directions=[d for _, d in OBJECTIVES], sampler=sampler)
    enqueue_baseline(study, space)  # as a search's set-up does: its first trial
    seen: list[tuple[float, ...]] = []
    distinct: set[str] = set()
    out = {}
    for k in range(1, trials + 1):
        trial = study.ask()
        params = space.suggest(trial)
        key = DeployConfig.from_params(params).digest()
        distinct.add(key)
        value = table[key]
        if value is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, [(-v if d == "maximize" else v) for v, (_, d) in zip(value, OBJECTIVES)])
            seen.append(value)
        if k in CHECKPOINTS:
            out[k] = (scorer.hv(seen), len(distinct))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-7b")
    parser.add_argument("--hardware", default="ascend910")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--samplers", nargs="*", default=list(SAMPLERS))
    parser.add_argument("--max-trials", type=int, default=max(CHECKPOINTS),
                        help="stop each run here (GP needs about a second a trial by 100 trials)")
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    backend = SimBackend(args.hardware)
    space = backend.adapt_space(load_space())
    spec, workload = resolve_model(args.model), Workload()
    configs = space.grid()
    t0 = time.perf_counter()
    table: dict[str, tuple | None] = {}
    for params in configs:
        config = DeployConfig.from_params(params)
        p = predict(spec, config, workload, backend.profile)
        table[config.digest()] = losses(p.bench()) if p.feasible else None
    elapsed = time.perf_counter() - t0
    feasible = sorted({v for v in table.values() if v is not None})
    arr = np.asarray(feasible)
    front = [v for i, v in enumerate(feasible) if not ((arr <= arr[i]).all(axis=1) & (arr < arr[i]).any(axis=1)).any()]
    scorer = Scorer(np.asarray(front))
    exact = scorer.hv(front)
    print(f"{args.model} on {backend.profile.label} (simulated), default workload: {len(configs)} configurations, "
          f"{sum(v is not None for v in table.values())} feasible, predicted in {elapsed:.2f} s ({elapsed / len(configs) * 1e6:.0f} us each)")
    print(f"exact Pareto front: {len(front)} configurations; hypervolume {exact:.4f} (normalised objectives)")
    print(f"dropped by the backend: {space.dropped or 'nothing'}")
    header = f"{'sampler':<8}" + "".join(f"{f'{n} trials':>16}" for n in CHECKPOINTS) + f"{'s/run':>8}"
    print(header)
    print("-" * len(header))
    for name in args.samplers:
        runs = []
        t0 = time.perf_counter()
        try:
            for seed in range(args.seeds):
                runs.append(run_sampler(name, seed, space, table, scorer, args.max_trials))
        except ImportError as exc:  # GPSampler needs SciPy, which the project does not pin
            print(f"{name:<8} unavailable: {exc}")
            continue
        per_run = (time.perf_counter() - t0) / args.seeds
        cells = []
        for n in CHECKPOINTS:
            if n not in runs[0]:
                cells.append("-")
                continue
            frac = statistics.median(r[n][0] for r in runs) / exact
            uniq = statistics.median(r[n][1] for r in runs)
            cells.append(f"{frac * 100:6.1f}% ({uniq:>3.0f}u)")
        print(f"{name:<8}" + "".join(f"{c:>16}" for c in cells) + f"{per_run:>8.1f}")
    print(f"cells: median hypervolume as % of the exact front's, (u) median distinct configurations evaluated; "
          f"15% of the grid is {0.15 * len(configs):.0f} evaluations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
