"""Does the simulator's guidance find better configurations in fewer trials? Guided against `--no-guide` searches of
the default space, over several seeds, on a synthetic machine whose truth the guide does not know.

    python scripts/bench_guide.py [--seeds 10] [--trials 25] [--at 10 25] [--sampler tpe]

The truth: the cpu-local profile (this machine's measured peaks, its fitted factors) with every factor the guide
fits multiplied by its own random factor in [1/2, 2] per seed, then each configuration's throughput, TPOT and
memory by a fixed factor of its own (log-normal, sigma 0.2 for speed and 0.05 for memory: the interactions no
analytical model captures), and each measurement by noise (sigma 0.03). So the guide starts from a prior that is
wrong by up to 2x per factor, and its refit can never match the truth exactly. The gate's truth is this machine's
(SmolLM2): plain bf16/fp32 and w8a16 pass, w8a8 and w4a16 fail at the default space's fallback depths.

Each arm runs the same study code (autotune/study/loop.py) with the same sampler and seed; the only difference is
`guided`. The score is the hypervolume of the true figures of the gate-passing configurations tried by trial N,
as a share of the hypervolume of the true front of the whole space (1.0: the front was found), with the axes
scaled by the space's range; and the best true throughput found as a share of the space's best."""
from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import statistics
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import numpy as np  # noqa: E402
import optuna  # noqa: E402
from optuna._hypervolume import compute_hypervolume  # noqa: E402 - the same hypervolume Optuna's samplers use

from autotune.backends import get_backend  # noqa: E402
from autotune.backends.base import Backend  # noqa: E402
from autotune.config.deploy import DeployConfig  # noqa: E402
from autotune.config.workload import Workload  # noqa: E402
from autotune.models.registry import resolve_model  # noqa: E402
from autotune.probe.capabilities import Capabilities, Precision, restrict_space  # noqa: E402
from autotune.sim.fit import CPU_FIT, with_factors  # noqa: E402
from autotune.sim.hardware import load_profile  # noqa: E402
from autotune.sim.predict import predict  # noqa: E402
from autotune.space.search_space import DEFAULT_SPACE, load_space  # noqa: E402
from autotune.study.loop import run_search  # noqa: E402
from autotune.study.settings import OBJECTIVES, SearchSettings, make_sampler  # noqa: E402
from autotune.study.setup import enqueue_baseline  # noqa: E402
from autotune.trial.job import JobResult, Status  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_record import machine, write  # noqa: E402
from bench_tables import guide_table  # noqa: E402

METRICS = ("throughput_tok_s", "tpot_p99_ms", "peak_memory_mb")
PASSING = {"none", "w8a16"}


class TruthBackend(Backend):
    """A machine that answers every trial from its hidden truth. Named "cpu" so that the study guides it with the
    cpu-local profile, as it guides this machine's CPU; the precisions are this class of CPU's (bf16 and fp32
    native, fp16 emulated) and two cores."""

    name = "cpu"

    def __init__(self, seed: int, model: str, workload: Workload) -> None:
        self.seed, self.spec, self.workload = seed, resolve_model(model), workload
        rng = random.Random(seed)
        prior = load_profile("cpu-local")
        values = {}
        for name in CPU_FIT:
            base = (prior.factors.quant_bw_eff[name.split(".", 1)[1]] if name.startswith("quant_bw_eff.")
                    else getattr(prior.factors, name))
            scaled = base * math.exp(rng.uniform(-math.log(2), math.log(2)))
            values[name] = min(scaled, 1.0) if name.endswith("_eff") or "_eff." in name else scaled
        self.profile = with_factors(prior, values)
        self.noise = random.Random(seed + 10_000)

    def unavailable(self):
        return None

    def capabilities(self) -> Capabilities:
        return Capabilities("cpu", "synthetic", (
            Precision("bf16", True, True, "native"), Precision("fp32", True, True, "native"),
            Precision("fp16", False, False, "emulated: 3x fp32's matmul time")))

    def adapt_space(self, space):
        space = space.restrict("device_power", (1, 2), "two cores")
        return restrict_space(space, self.capabilities())

    def fingerprint(self) -> dict:
        return {"hardware": f"truth-{self.seed}"}

    def truth(self, config: DeployConfig) -> dict | None:
        """The configuration's true figures, None where it does not run (out of memory)."""
        prediction = predict(self.spec, config, self.workload, self.profile)
        if not prediction.feasible:
            return None
        digest = hashlib.sha256(f"{self.seed}:{config.digest()}".encode()).digest()
        own = random.Random(digest)
        figures = prediction.bench()
        speed, memory = math.exp(own.gauss(0, 0.2)), math.exp(own.gauss(0, 0.05))
        return {"throughput_tok_s": figures["throughput_tok_s"] * speed,
                "tpot_p99_ms": figures["tpot_p99_ms"] / speed, "peak_memory_mb": figures["peak_memory_mb"] * memory}

    def run(self, job, timeout_s):
        config = DeployConfig.from_dict(job.config)
        passed = config.quant in PASSING
        agreement = 0.999 if passed else 0.97
        gate = {"tie_aware_agreement": agreement, "raw_agreement": agreement, "decode_agreement": agreement,
                "decode_positions": 6144, "positions": 5110, "perplexity": 20.0, "reference_perplexity": 20.0,
                "kl_divergence": 0.01, "tie_epsilon": 0.05, "min_agreement": 0.995, "passed": passed}
        if not passed:
            return JobResult(Status.GATED, gate=gate)
        figures = self.truth(config)
        if figures is None:
            return JobResult(Status.INFEASIBLE, reason="out of memory")
        bench = {k: v * math.exp(self.noise.gauss(0, 0.03)) for k, v in figures.items()}
        bench.update({"throughput_min": bench["throughput_tok_s"], "throughput_max": bench["throughput_tok_s"],
                      "tpot_p50_ms": bench["tpot_p99_ms"], "ttft_p50_ms": 50.0, "ttft_p99_ms": 60.0,
                      "kv_reserved_peak_mb": 1.0, "repeats": 1})
        return JobResult(Status.OK, gate=gate, bench=bench, timing={"build_s": 1.0, "gate_s": 1.0, "bench_s": 1.0})


def _vector(figures: dict) -> list[float]:
    return [-figures["throughput_tok_s"], figures["tpot_p99_ms"], figures["peak_memory_mb"]]


class Scale:
    """The space's true range per objective, to put the axes on one scale (0: best, 1: worst in the space)."""

    def __init__(self, truths: list[dict]) -> None:
        points = np.array([_vector(t) for t in truths])
        self.low, self.high = points.min(axis=0), points.max(axis=0)

    def hypervolume(self, truths: list[dict]) -> float:
        if not truths:
            return 0.0
        points = (np.array([_vector(t) for t in truths]) - self.low) / (self.high - self.low)
        return compute_hypervolume(points, np.full(3, 1.0))


def _search(backend: TruthBackend, space, model: str, workload: Workload, seed: int, trials: int, guided: bool,
            sampler: str, folder: str):
    url = f"sqlite:///{folder}/{'guided' if guided else 'unguided'}-{seed}.db"
    study = optuna.create_study(study_name="s", storage=url, directions=[d for _, d in OBJECTIVES],
                                sampler=make_sampler(sampler, seed))
    # What a real study's set-up records first (autotune/study/setup.py); the truth has no weights or texts.
    study.set_user_attr("model_checksum", f"synthetic-{seed}")
    study.set_user_attr("eval_digest", "synthetic")
    settings = SearchSettings(model=model, study="s", storage=url, trials=trials, workload=workload,
                              guided=guided, seed=seed, sampler=sampler)
    enqueue_baseline(study, space)  # as a search's set-up does: the plain deployment first
    run_search(settings, space, backend, study)
    return study


def _tried(study, backend: TruthBackend, n: int) -> list[dict]:
    """The true figures of the gate-passing, runnable configurations among the study's first `n` trials."""
    done = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()][:n]
    out = []
    for t in done:
        if t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs.get("bench"):
            truth = backend.truth(DeployConfig.from_dict(t.user_attrs["config"]))
            if truth is not None:
                out.append(truth)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--trials", type=int, default=25)
    parser.add_argument("--at", type=int, nargs="+", default=[10, 25])
    parser.add_argument("--sampler", default="tpe")
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args()
    workload = Workload()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rows: dict[tuple[bool, int], list[tuple[float, float]]] = {}
    per_seed: list[dict] = []
    with tempfile.TemporaryDirectory() as folder:  # the studies' own log goes to stderr
        for seed in range(args.seeds):
            backend = TruthBackend(seed, args.model, workload)
            space = backend.adapt_space(load_space(DEFAULT_SPACE))
            passing = [DeployConfig.from_params(p) for p in space.grid()]
            truths = [t for c in passing if c.quant in PASSING and (t := backend.truth(c)) is not None]
            scale, best = Scale(truths), max(t["throughput_tok_s"] for t in truths)
            front_hv = scale.hypervolume(truths)
            for guided in (True, False):
                study = _search(backend, space, args.model, workload, seed, args.trials, guided, args.sampler,
                                folder)
                for n in args.at:
                    tried = _tried(study, backend, n)
                    share = scale.hypervolume(tried) / front_hv
                    top = max((t["throughput_tok_s"] for t in tried), default=0.0) / best
                    rows.setdefault((guided, n), []).append((share, top))
                    per_seed.append({"seed": seed, "arm": "guided" if guided else "unguided", "trials": n,
                                     "hypervolume_share": round(share, 4), "best_throughput_share": round(top, 4)})
            print(f"seed {seed}: " + ", ".join(
                f"{'guided' if g else 'unguided'}@{n} hv {rows[(g, n)][-1][0]:.3f} best {rows[(g, n)][-1][1]:.3f}"
                for g in (True, False) for n in args.at), flush=True)
    print(f"{args.seeds} seeds, sampler {args.sampler}, default space, model {args.model}; medians [min, max]")
    print(f"{'arm':<10} {'trials':>6} {'hypervolume share':>26} {'best throughput share':>26}")
    for (guided, n), values in sorted(rows.items(), key=lambda kv: (kv[0][1], not kv[0][0])):
        hv, top = [v[0] for v in values], [v[1] for v in values]
        print(f"{'guided' if guided else 'unguided':<10} {n:>6} "
              f"{statistics.median(hv):>10.3f} [{min(hv):.3f}, {max(hv):.3f}] "
              f"{statistics.median(top):>10.3f} [{min(top):.3f}, {max(top):.3f}]")
    for n in args.at:
        wins = sum(g[0] > u[0] for g, u in zip(rows[(True, n)], rows[(False, n)]))
        print(f"at {n} trials the guided search has the larger hypervolume in {wins} of {args.seeds} seeds")
    fingerprint = get_backend("cpu").fingerprint()
    record = {"kind": "guide", "machine": machine(fingerprint), "model": args.model, "sampler": args.sampler,
              "seeds": args.seeds, "trials": args.trials, "at": args.at, "rounds": per_seed}
    write(f"bench_guide-{args.model}-{fingerprint['hardware']}", record)
    print(guide_table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
