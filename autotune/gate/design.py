"""What the gate measures with, as data: every figure here decides a gate's verdict or the reference's content, so
the cache keys take all of them (autotune/gate/cache.py reads this module's upper-case names), and changing one
can never serve a stale answer.

The decode check's sizes and rule: a correct build must pass with a margin, and a verdict must mean something. With
prompts of 48 tokens and 32 scored decode steps each, one stage of 48 prompts is 1,536 positions, up to 192 prompts
(6,144 positions). After each stage, Wald's sequential probability ratio test, on counts divided by the prompts'
design effect (the prompt is the independent unit: autotune/gate/verdict.py), weighs a build at the fail point (it
misses DECODE_FAIL_MISS_RATIO times as often as the threshold allows: true agreement 0.994 at 0.995) against one at
the pass point (DECODE_PASS_MISS_RATIO times: 0.997), with error rates DECODE_ALPHA (a build at the fail point
passes) and DECODE_BETA (one at the pass point does not). Undecided at the cap is "marginal": not a pass unless the
search accepts marginal builds. Many short continuations of different passages, not a few long ones: a lost
decision then costs one position, and the sample is of many contexts."""
from __future__ import annotations

import sys

__all__ = ["TOP_K", "DECODE_PROMPT_TOKENS", "DECODE_NEW_TOKENS", "DECODE_STAGE_PROMPTS", "DECODE_MAX_PROMPTS",
           "HOLDOUT_MAX_PROMPTS", "HOLDOUT_OVERLAP_TOKENS", "CONFIDENCE", "DECODE_FAIL_MISS_RATIO",
           "DECODE_PASS_MISS_RATIO", "DECODE_ALPHA",
           "DECODE_BETA", "GATE_VERSION", "REFERENCE_VERSION", "design"]

# Reference distributions are kept as their top-K: enough to decide near-ties and most of the KL mass.
TOP_K = 64
DECODE_PROMPT_TOKENS = 48
# The first continuation token is chosen from the prefill's logits, not by a decode step: it is generated (the
# decode steps need it) but not scored, so every scored position is one of the decode path.
DECODE_NEW_TOKENS = 33
DECODE_STAGE_PROMPTS = 48
DECODE_MAX_PROMPTS = 192
# The held-back re-check of the chosen recipes is the decode check's rule on other prompts: at most 128 of them
# (4,096 positions), as many as the held-back texts give unseen with SmolLM2's tokenizer (136), rounded down.
HOLDOUT_MAX_PROMPTS = 128
# A held-back passage sharing this many consecutive tokens with the gate's texts is left out.
HOLDOUT_OVERLAP_TOKENS = 16
CONFIDENCE = 0.95  # of the Clopper-Pearson intervals the verdicts are stated with
DECODE_FAIL_MISS_RATIO = 1.2
DECODE_PASS_MISS_RATIO = 0.6
DECODE_ALPHA = 0.05
DECODE_BETA = 0.2
# Bump when what a gate computes changes in a way the figures above do not say (how positions are scored).
GATE_VERSION = "4"  # 4: the decode verdict is the sequential test on the prompts' effective counts
# Bump when the reference's content changes in a way the figures above do not say (what is stored).
REFERENCE_VERSION = "3"


def design() -> dict:
    """Every upper-case figure of this module, by name: what the cache keys are derived from."""
    module = sys.modules[__name__]
    return {name: getattr(module, name) for name in dir(module) if name.isupper() and not name.startswith("_")}
