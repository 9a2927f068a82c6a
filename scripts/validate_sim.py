"""Predicted against measured, with the error of each figure.

    python scripts/validate_sim.py [--cpu-storage sqlite:///studies/X.db] [--loo]
                                   [--goodput-storage sqlite:///studies/Y.db --goodput-study NAME]

1. Published figures (hardware/anchors/published.yaml, with their sources) against the calibrated profiles. These
   figures are also what calibrated the profiles (in-sample); --loo refits each profile without one figure at a time
   and predicts that figure (held out), where a profile has more than one figure.
2. SmolLM2 on this machine's CPU backend: every completed trial of the storage against cpu-local (goal: median
   absolute error <= 25% on throughput and on peak memory, over at least 8 configurations). If cpu-local was
   calibrated on the same storage the comparison is in-sample; --loo holds out each trial in turn.
3. Goodput: every trial of a study under --slo, its measured goodput against the simulated server's (sim/served.py)
   with each runtime's profile refitted to that runtime's trials of the study, as the guide predicts it (in-sample
   for the offline figures the fit reads; goodput itself is never fitted).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autotune.sim.anchors import cpu_trial_anchors, published_groups  # noqa: E402
from autotune.sim.fit import BOUNDS, CPU_FIT, Anchor, anchor_errors, fit_factors, with_factors  # noqa: E402
from autotune.sim.hardware import load_profile  # noqa: E402

GOAL = 0.25


def _err(pred: float, target: float) -> float:
    return pred / target - 1


def _row(anchor: Anchor, pred: float, held: float | None) -> str:
    held_s = "-" if held is None else f"{held:9.1f} ({_err(held, anchor.target) * 100:+4.0f}%)"
    return (f"{anchor.spec.name:<12} {anchor.config.label():<50} {anchor.metric:<16} {anchor.target:>9.1f} "
            f"{pred:>9.1f} ({_err(pred, anchor.target) * 100:+4.0f}%)  {held_s}")


def _held_out(profile_name: str, anchors: list[Anchor], fit: list[str], key) -> dict[int, float]:
    """Leave one group of anchors out (grouped by `key`), refit on the rest, predict the held-out ones."""
    groups = sorted({key(a) for a in anchors})
    if len(groups) < 2:
        return {}
    base = load_profile(profile_name, calibrated=False)
    out: dict[int, float] = {}
    for g in groups:
        train = [a for a in anchors if key(a) != g]
        fitted = with_factors(base, fit_factors(base, train, fit, BOUNDS, pull=1e-2, sweeps=10))
        test = [(i, a) for i, a in enumerate(anchors) if key(a) == g]
        for (i, _), (_, pred) in zip(test, anchor_errors(fitted, [a for _, a in test])):
            out[i] = pred
    return out


def published(loo: bool) -> None:
    print("== published figures vs simulated; in-sample: these figures calibrated the profile ==")
    print(f"{'model':<12} {'configuration':<50} {'metric':<16} {'reference':>9} {'predicted':>9} {'':7}  held out")
    for group in published_groups():
        profile = load_profile(group.profile)
        anchors = list(group.anchors)
        held = _held_out(group.profile, anchors, list(group.fit), lambda a: a.config.label()) if loo else {}
        print(f"-- {profile.label}: {group.source}")
        for i, (a, pred) in enumerate(anchor_errors(profile, anchors)):
            print(_row(a, pred, held.get(i)))
    # The roofline of batch-1 decode: 7B W8A16 weights (~7 GB) over the 910's ~1.2 TB/s ~ 5.8 ms per token.
    from autotune.models.registry import resolve_model
    from autotune.sim.cost import streamed_weight_bytes

    ideal = streamed_weight_bytes(resolve_model("llama-7b"), "w8a16") / (load_profile("ascend910").bandwidth_gbs * 1e9)
    print(f"roofline check: llama-7b w8a16 weight bytes / 910 peak bandwidth = {ideal * 1e3:.2f} ms per token "
          f"(the roofline estimate: ~5.8 ms; {_err(ideal * 1e3, 5.8) * 100:+.0f}%)")


def cpu(storage: str, loo: bool) -> None:
    anchors, studies = cpu_trial_anchors(storage)
    profile = load_profile("cpu-local")
    trials = sorted({a.source for a in anchors})
    print(f"\n== SmolLM2 on the CPU backend: {len(trials)} measured trials from {storage} ({', '.join(studies)}) "
          f"vs {profile.label} ==")
    print(f"calibration of {profile.name}: {profile.calibration_source}")
    if not anchors:
        print("no completed CPU trials: run `autotune search --backend cpu ...` into this storage first")
        return
    held = _held_out("cpu-local", anchors, CPU_FIT, lambda a: a.source) if loo else {}
    print(f"{'model':<12} {'configuration':<50} {'metric':<16} {'measured':>9} {'predicted':>9} {'':7}  held out")
    errors: dict[str, list[float]] = {}
    held_errors: dict[str, list[float]] = {}
    for i, (a, pred) in enumerate(anchor_errors(profile, anchors)):
        print(_row(a, pred, held.get(i)))
        errors.setdefault(a.metric, []).append(abs(_err(pred, a.target)))
        if i in held:
            held_errors.setdefault(a.metric, []).append(abs(_err(held[i], a.target)))
    for metric, errs in errors.items():
        line = f"median |error| {metric:<16} {statistics.median(errs) * 100:5.1f}% over {len(errs)}"
        if metric in held_errors:
            line += f"; held out {statistics.median(held_errors[metric]) * 100:5.1f}%"
        if metric in ("throughput_tok_s", "peak_memory_mb"):
            line += f"  (goal <= {GOAL * 100:.0f}%)"
        print(line)
    if len(trials) < 8:
        print(f"only {len(trials)} configurations: the goal asks for >= 8 (see scripts/calibrate_sim.py for how "
              "to produce them)")


def goodput(storage: str, study_name: str) -> None:
    import optuna

    from autotune.config.deploy import DeployConfig
    from autotune.config.slo import Slo
    from autotune.config.workload import Workload
    from autotune.models.registry import resolve_model
    from autotune.sim.served import predict_goodput
    from autotune.sim.stand_in import stand_in
    from autotune.space.search_space import DEFAULT_SPACE, load_space
    from autotune.study.guide import Guide

    study = optuna.load_study(study_name=study_name, storage=storage)
    if not study.user_attrs.get("slo"):
        print(f"\nstudy {study_name} ran without --slo: it has no goodput to compare")
        return
    slo = Slo(**study.user_attrs["slo"])
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs.get("goodput")]
    workload = Workload(**done[0].user_attrs["measured_under"]["workload"]) if done else Workload()
    spec = resolve_model(study.user_attrs["model"])
    guide = Guide(spec, load_space(DEFAULT_SPACE), workload, load_profile("cpu-local"), slo)
    guide.refit(study.trials)
    print(f"\n== goodput under {slo.label()}: {len(done)} trials of {study_name} vs the simulated server ==")
    print(f"{'trial':>5} {'configuration':<58} {'measured':>9} {'predicted':>9}")
    for t in done:
        config = DeployConfig.from_dict(t.user_attrs["config"])
        modeled, profile = stand_in(config), guide.profiles.get(config.runtime)
        measured = t.user_attrs["goodput"]["goodput_req_s"]
        if modeled is None or profile is None:
            print(f"{t.number:>5} {config.label():<58} {measured:>9.2f} {'-':>9}")
            continue
        pred = predict_goodput(spec, modeled, workload, profile, slo)["goodput_req_s"]
        error = f" ({_err(pred, measured) * 100:+4.0f}%)" if measured else ""
        print(f"{t.number:>5} {config.label():<58} {measured:>9.2f} {pred:>9.2f}{error}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-storage", default=None, help="SQLAlchemy URL of a study storage with CPU trials")
    parser.add_argument("--loo", action="store_true", help="also leave-one-out: refit without each figure")
    parser.add_argument("--goodput-storage", default=None, help="SQLAlchemy URL of a storage with a study under --slo")
    parser.add_argument("--goodput-study", default=None, help="that study's name")
    args = parser.parse_args(argv)
    published(args.loo)
    if args.cpu_storage:
        cpu(args.cpu_storage, args.loo)
    if args.goodput_storage and args.goodput_study:
        goodput(args.goodput_storage, args.goodput_study)
    return 0


if __name__ == "__main__":
    sys.exit(main())
