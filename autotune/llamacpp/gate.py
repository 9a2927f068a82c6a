"""The accuracy gate on llama.cpp's own logits: the same fp32 reference, windows, decode prompts, scoring and
verdicts as autotune's engine gets (autotune/gate/), only the candidate's logits come from a llama.cpp context of
the configuration being tried."""
from __future__ import annotations

import math
from typing import Any

import torch

from autotune.gate.accuracy import score_window  # the windows' scoring itself: one definition for every engine
from autotune.gate.design import DECODE_STAGE_PROMPTS
from autotune.gate.reference import Reference, agreeing
from autotune.gate.result import GateResult
from autotune.gate.verdict import interval, judge
from autotune.llamacpp.engine import LlamaCppContext, Request

__all__ = ["llamacpp_gate", "llamacpp_decode_check"]


def llamacpp_gate(ctx: LlamaCppContext, reference: Reference, windows: list[list[int]], prompts: list[list[int]],
                  *, tie_epsilon: float = 0.05, min_agreement: float = 0.995) -> GateResult:
    """Teacher-forced windows (each one sequence, every position's logits), stopped once a pass is out of reach;
    then the decode check through the context's slots (autotune/gate/accuracy.py's evaluate_gate, for llama.cpp)."""
    total = sum(len(w) - 1 for w in windows)
    allowed_misses = (1 - min_agreement) * total
    raw = tie = offset = 0
    nll = kl = 0.0
    for window in windows:
        logits = torch.from_numpy(ctx.all_logits(window)[:-1])
        offset, agree, nll_w, kl_w = score_window(window, torch.log_softmax(logits, dim=-1), reference, offset,
                                                   tie_epsilon)
        raw, tie, nll, kl = raw + agree[0], tie + agree[1], nll + nll_w, kl + kl_w
        if offset - tie >= allowed_misses and offset < total:
            break
    figures: dict[str, Any] = dict(
        tie_aware_agreement=tie / offset, raw_agreement=raw / offset, perplexity=math.exp(nll / offset),
        reference_perplexity=reference.perplexity, kl_divergence=kl / offset, positions=offset,
        tie_epsilon=tie_epsilon, min_agreement=min_agreement, tie_aware_interval=list(interval(tie, offset)))
    if offset < total:
        return GateResult(**figures, stopped_early=True)
    if tie / offset <= min_agreement:
        return GateResult(**figures)
    return GateResult(**figures, **llamacpp_decode_check(ctx, reference, prompts, tie_epsilon, min_agreement))


def llamacpp_decode_check(ctx: LlamaCppContext, reference: Reference, prompts: list[list[int]], tie_epsilon: float,
                          min_agreement: float, stage: int = DECODE_STAGE_PROMPTS) -> dict:
    """autotune/gate/decode.py's check through llama.cpp's decode path: each stage's prompts run together through
    the context's `parallel` sequences (continuous batching, as served), the reference's continuation forced, the
    greedy choice at every decode step scored; staged until the verdict is decided."""
    prompts = prompts[:len(reference.decode_tokens)]
    new = reference.decode_top_ids.shape[1]
    cap = (new - 1) * len(prompts)
    raw = tie = positions = used = 0
    first_miss: int | None = None
    while True:
        chunk = list(range(used, min(used + stage, len(prompts))))
        outs = ctx.run([Request(prompts[i], new, forced=tuple(reference.decode_tokens[i])) for i in chunk])
        for i, out in zip(chunk, outs):
            same, agree = agreeing(torch.tensor(out.greedy_ids[1:]), reference.decode_top_ids[i, 1:],
                                   reference.decode_top_logprobs[i, 1:], tie_epsilon)
            raw += int(same.sum())
            tie += int(agree.sum())
            misses = (~agree).nonzero()
            if len(misses):
                first_miss = min(int(misses[0]) + 1, first_miss if first_miss is not None else new)
        used += len(chunk)
        positions += (new - 1) * len(chunk)
        verdict = judge(tie, positions, min_agreement, cap_positions=cap)
        if verdict is not None:
            break
    return {"decode_agreement": tie / positions, "decode_raw_agreement": raw / positions,
            "decode_positions": positions, "decode_prompts": used, "decode_interval": [verdict.low, verdict.high],
            "decode_passed": verdict.passed, "decode_decided": verdict.decided, "decode_verdict": verdict.reason,
            "decode_first_miss": first_miss}
