"""The decode check's pass probability against a build's true agreement, computed from the rule itself
(autotune/gate/verdict: its design effect, evidence and bounds, at the staged check's sizes from
autotune/gate/design.py) over simulated builds:

    python scripts/gate_pass_probability.py            # the table, and docs/data/gate_pass_probability.json

Each simulated build scores DECODE_MAX_PROMPTS prompts of 32 positions; the rule looks after every stage, as the
gate does, and stops where it decides. Two kinds of build: positions that miss independently (rho 0), and prompts
whose misses cluster as a beta-binomial with intra-prompt correlation rho (a drifting prompt misses again). The
random draws are seeded, so the table is the same on every run: tests/test_gate_pass_probability.py re-derives it."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from autotune.gate.design import DECODE_MAX_PROMPTS, DECODE_NEW_TOKENS, DECODE_STAGE_PROMPTS
from autotune.gate.verdict import bounds, design_effect, evidence

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "data" / "gate_pass_probability.json"
THRESHOLD = 0.995
AGREEMENTS = (0.993, 0.994, 0.995, 0.996, 0.997, 0.998)
CORRELATIONS = (0.0, 0.05)
BUILDS = 20_000  # Monte Carlo standard error at most 0.0035 on any probability
SEED = 0
PASS, FAIL, MARGINAL = 1, 2, 3


def prompt_misses(p: float, rho: float, rng: np.random.Generator) -> np.ndarray:
    """[BUILDS, DECODE_MAX_PROMPTS] misses per prompt for builds of true agreement p."""
    scored, shape = DECODE_NEW_TOKENS - 1, (BUILDS, DECODE_MAX_PROMPTS)
    if rho == 0:
        return rng.binomial(scored, 1 - p, size=shape)
    spread = (1 - rho) / rho  # the beta's a + b, for intra-prompt correlation 1 / (a + b + 1) = rho
    return rng.binomial(scored, rng.beta((1 - p) * spread, p * spread, size=shape))


def outcomes(misses: np.ndarray, threshold: float = THRESHOLD) -> tuple[np.ndarray, np.ndarray]:
    """Each build's verdict (PASS, FAIL, MARGINAL) and the prompts it scored, by the rule looked at after every
    stage."""
    scored = DECODE_NEW_TOKENS - 1
    to_fail, to_pass = bounds()
    verdict = np.zeros(len(misses), dtype=int)
    prompts = np.zeros(len(misses), dtype=int)
    for looked in range(DECODE_STAGE_PROMPTS, DECODE_MAX_PROMPTS + 1, DECODE_STAGE_PROMPTS):
        alive = verdict == 0
        sample = misses[alive, :looked]
        positions = scored * looked
        llr = evidence(positions - sample.sum(axis=1), positions, threshold, design_effect(sample, scored))
        last = MARGINAL if looked == DECODE_MAX_PROMPTS else 0
        verdict[alive] = np.where(llr >= to_pass, PASS, np.where(llr <= to_fail, FAIL, last))
        prompts[alive] = looked
    return verdict, prompts


def pass_probability(p: float, rho: float) -> dict:
    verdict, prompts = outcomes(prompt_misses(p, rho, np.random.default_rng([SEED, round(p * 1e4), round(rho * 1e4)])))
    share = {name: round(float((verdict == code).mean()), 4) for name, code in
             (("pass_probability", PASS), ("fail_probability", FAIL), ("marginal_probability", MARGINAL))}
    return {"true_agreement": p, "rho": rho, **share, "expected_prompts": round(float(prompts.mean()), 1)}


def rows() -> list[dict]:
    return [pass_probability(p, rho) for rho in CORRELATIONS for p in AGREEMENTS]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    table = rows()
    print(f"{'rho':>5} {'true agreement':>14} {'P(pass)':>8} {'P(fail)':>8} {'P(marginal)':>11} {'prompts':>8}")
    for r in table:
        print(f"{r['rho']:>5.2f} {r['true_agreement']:>14.3f} {r['pass_probability']:>8.4f} "
              f"{r['fail_probability']:>8.4f} {r['marginal_probability']:>11.4f} {r['expected_prompts']:>8.1f}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    record = {"command": "python scripts/gate_pass_probability.py", "commit": commit, "threshold": THRESHOLD,
              "stage_prompts": DECODE_STAGE_PROMPTS, "max_prompts": DECODE_MAX_PROMPTS,
              "scored_per_prompt": DECODE_NEW_TOKENS - 1, "builds": BUILDS, "seed": SEED,
              "model": "per-prompt misses beta-binomial with intra-prompt correlation rho (rho 0: binomial)",
              "rows": table}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
