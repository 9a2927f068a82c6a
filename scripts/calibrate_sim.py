"""Fit the simulator's efficiency factors and write them into hardware/<profile>.yaml (`calibration`).

    python scripts/calibrate_sim.py                                   # published figures (hardware/anchors/published.yaml)
    python scripts/calibrate_sim.py --cpu-storage sqlite:///studies/X.db   # and cpu-local on CPU trials

ascend910 is fitted on the reference deployment's batch-1 figures only; a100-80g and h100 on their published
figures; profiles without figures borrow a calibrated relative's factors (hardware/anchors/published.yaml says
which and why); cpu-local on this project's CPU-backend trials. To produce CPU trials (about 1-2 min each):
    autotune search --model smollm2-135m --backend cpu --trials 12 --study cpu-calib --storage sqlite:///studies/cpu-calib.db
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autotune.sim.anchors import borrowed, cpu_trial_anchors, published_groups  # noqa: E402
from autotune.sim.fit import BOUNDS, CPU_FIT, Anchor, anchor_errors, fit_factors, with_factors  # noqa: E402
from autotune.sim.hardware import HardwareProfile, load_profile, profile_path  # noqa: E402


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def _factor_block(profile: HardwareProfile, names: list[str]) -> dict:
    out: dict = {}
    for name in names:
        if name.startswith("quant_bw_eff."):
            out.setdefault("quant_bw_eff", {})[name.split(".", 1)[1]] = _sig(
                profile.factors.quant_bw_eff[name.split(".", 1)[1]])
        else:
            out[name] = _sig(getattr(profile.factors, name))
    return out


def write_calibration(name: str, calibration: dict, dry_run: bool) -> None:
    path = profile_path(name)
    text = path.read_text()
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    data = yaml.safe_load(text)
    old = (data.get("calibration") or {}).get("factors")
    if old != calibration["factors"]:
        data["version"] = int(data["version"]) + 1  # the label "name vN" changes whenever the factors do
    data["calibration"] = calibration
    if not dry_run:
        path.write_text(header + yaml.safe_dump(data, sort_keys=False, width=110))
    print(f"{name}: version {data['version']}, factors {calibration['factors']}")


def calibrate(name: str, anchors: list[Anchor], names: list[str], source: str, pull: float) -> HardwareProfile:
    profile = load_profile(name, calibrated=False)  # start from the priors, never from a previous fit
    fitted = with_factors(profile, fit_factors(profile, anchors, names, BOUNDS, pull=pull))
    for anchor, predicted in anchor_errors(fitted, anchors):
        print(f"  {name:<10} {anchor.config.label():<48} {anchor.metric:<16} target {anchor.target:>9.1f}  "
              f"fit {predicted:>9.1f} ({(predicted / anchor.target - 1) * 100:+.0f}%)")
    return fitted


def _record(fitted: HardwareProfile, names: list[str], anchors: list[Anchor], source: str) -> dict:
    return {
        "source": source, "date": time.strftime("%Y-%m-%d"), "fitted": names,
        "anchors": [{"config": a.config.label(), "model": a.spec.name, "metric": a.metric, "target": a.target,
                     "fit": _sig(p)} for a, p in anchor_errors(fitted, anchors)],
        "factors": _factor_block(fitted, names),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-storage", default=None, help="SQLAlchemy URL of a study storage with CPU trials")
    parser.add_argument("--dry-run", action="store_true", help="print the fits, write nothing")
    args = parser.parse_args(argv)
    fits: dict[str, tuple[HardwareProfile, list[str], str]] = {}
    for group in published_groups():
        source = f"fit on {group.source}" + (f"; assumed: {group.assumed}" if group.assumed else "")
        fitted = calibrate(group.profile, list(group.anchors), list(group.fit), source, pull=1e-3)
        fits[group.profile] = (fitted, list(group.fit), source)
        write_calibration(group.profile, _record(fitted, list(group.fit), list(group.anchors), source), args.dry_run)
    for name, rule in borrowed().items():
        donor, names, _ = fits[rule["from"]]
        label = donor.label if args.dry_run else load_profile(rule["from"]).label  # the version just written
        write_calibration(name, {"source": f"borrowed from {label}: {rule['why']}",
                                 "date": time.strftime("%Y-%m-%d"), "fitted": [],
                                 "factors": _factor_block(donor, names)}, args.dry_run)
    if args.cpu_storage:
        anchors, studies = cpu_trial_anchors(args.cpu_storage)
        trials = len({a.source for a in anchors})
        if not anchors:
            print(f"cpu-local: no completed CPU trials in {args.cpu_storage}; left as it was")
            return 0
        source = (f"fit on {trials} measured CPU-backend trials ({', '.join(studies)}) from {args.cpu_storage}"
                  + ("; few trials: most factors stay near their priors" if trials < 8 else ""))
        # Few trials determine few factors: a stronger pull keeps the others at their stated priors.
        fitted = calibrate("cpu-local", anchors, CPU_FIT, source, pull=1e-2 if trials < 8 else 1e-3)
        write_calibration("cpu-local", _record(fitted, CPU_FIT, anchors, source), args.dry_run)
    else:
        print("cpu-local: not calibrated (pass --cpu-storage; see the top of this script for producing trials)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
