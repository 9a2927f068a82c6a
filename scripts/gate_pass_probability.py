"""The decode check's pass probability against a build's true agreement, computed exactly from the rule itself
(autotune/gate/verdict.judge, called with the staged check's sizes from autotune/gate/design.py), with each scored
position an independent trial that agrees with probability p:

    python scripts/gate_pass_probability.py            # the table, and docs/data/gate_pass_probability.json

The independence is the rule's own assumption (the sequential test counts positions). The 32 positions of one prompt
are correlated, so a real build's verdicts scatter more than these figures say: they are the rule's best case."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from scipy.stats import binom

from autotune.gate.design import DECODE_MAX_PROMPTS, DECODE_NEW_TOKENS, DECODE_STAGE_PROMPTS
from autotune.gate.verdict import judge

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "data" / "gate_pass_probability.json"
THRESHOLD = 0.995
AGREEMENTS = (0.993, 0.994, 0.995, 0.996, 0.997, 0.998)


def pass_probability(p: float, threshold: float = THRESHOLD) -> dict:
    """P(pass), P(fail) and P(marginal: undecided at the cap), and the expected number of prompts scored, for a
    build whose every position agrees with probability `p`."""
    scored = DECODE_NEW_TOKENS - 1
    stage, cap = scored * DECODE_STAGE_PROMPTS, scored * DECODE_MAX_PROMPTS
    alive = {0: 1.0}  # cumulative misses -> probability, among the samples still undecided
    positions = 0
    passed = failed = marginal = prompts = 0.0
    new = binom(stage, 1 - p)
    most = int(new.ppf(1 - 1e-15)) + 1  # more misses in one stage than this: their mass is counted as failing
    pmf = [float(new.pmf(k)) for k in range(most + 1)]
    while alive:
        grown: dict[int, float] = {}
        for misses, weight in alive.items():
            for more in range(most + 1):
                grown[misses + more] = grown.get(misses + more, 0.0) + weight * pmf[more]
            failed += weight * float(new.sf(most))
        positions += stage
        prompts += sum(alive.values()) * DECODE_STAGE_PROMPTS
        alive = {}
        for misses, weight in grown.items():
            verdict = judge(positions - misses, positions, threshold, cap_positions=cap)
            if verdict is None:
                alive[misses] = weight
            elif verdict.passed:
                passed += weight
            elif verdict.decided:
                failed += weight
            else:
                marginal += weight
    return {"true_agreement": p, "pass_probability": round(passed, 4), "fail_probability": round(failed, 4),
            "marginal_probability": round(marginal, 4), "expected_prompts": round(prompts, 1)}


def rows() -> list[dict]:
    return [pass_probability(p) for p in AGREEMENTS]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    table = rows()
    print(f"{'true agreement':>14} {'P(pass)':>8} {'P(fail)':>8} {'P(marginal)':>11} {'prompts':>8}")
    for r in table:
        print(f"{r['true_agreement']:>14.3f} {r['pass_probability']:>8.4f} {r['fail_probability']:>8.4f} "
              f"{r['marginal_probability']:>11.4f} {r['expected_prompts']:>8.1f}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    record = {"command": "python scripts/gate_pass_probability.py", "commit": commit, "threshold": THRESHOLD,
              "stage_prompts": DECODE_STAGE_PROMPTS, "max_prompts": DECODE_MAX_PROMPTS,
              "scored_per_prompt": DECODE_NEW_TOKENS - 1, "assumption": "independent positions", "rows": table}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
