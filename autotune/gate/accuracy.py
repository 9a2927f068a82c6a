"""The accuracy gate: teacher-forced agreement with the full-precision reference over the evaluation windows, plus
perplexity and KL, then the decode check (autotune/gate/decode.py)."""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from autotune.engine import Engine
from autotune.gate.decode import decode_check
from autotune.gate.design import TOP_K
from autotune.gate.reference import Reference, agreeing, compute_reference
from autotune.gate.result import GateResult
from autotune.gate.verdict import interval

__all__ = ["Reference", "GateResult", "compute_reference", "evaluate_gate", "decode_check", "score_window",
           "score_windows", "TOP_K"]


def _windows_logits(engine: Engine, windows: list[list[int]]) -> torch.Tensor:
    """Teacher-forced logits of equal-length windows, prefilled together: [windows, len - 1, vocab]."""
    length = len(windows[0])
    runner = engine.runner(max_seq_len=length, max_batch=len(windows))
    slots = []
    for i in range(len(windows)):
        runner.cache.allocate(i, length)
        slots.append(runner.cache.slots(i, 0, length))
    logits = engine.model.prefill(torch.tensor(windows), torch.stack(slots), torch.full((len(windows),), length),
                                  all_logits=True)
    return logits[:, :-1]


# Windows prefilled per call: two, not one, so that a compiled prefill meets a batch dimension that can vary
# (a dimension first seen as 1 is specialised) while the logits stay at ~200 MB.
_WINDOWS_PER_CALL = 2


def evaluate_gate(engine: Engine, reference: Reference, windows: list[list[int]], prompts: list[list[int]],
                  *, tie_epsilon: float = 0.05, min_agreement: float = 0.995, max_seq_len: int = 0,
                  pool_tokens: int | None = None, stop_early: bool = True) -> GateResult:
    """Run the candidate over the same text; a position agrees when the candidate's top-1 is the reference's,
    or the reference gives it a probability within tie_epsilon of its own top-1 (the reference was undecided).

    Staged: the windows are scored in turn, and once they hold more misses than a pass over all of them allows,
    the gate stops (a certain fail: no remaining window could bring it back). A pass is always decided on every
    window and on the decode check, which runs over `prompts` (autotune/gate/decode.py). `max_seq_len` and
    `pool_tokens` are the benchmark's, so that the decode check runs (and compiles) the very graphs the benchmark
    will use. `stop_early=False` (quant-report) scores every
    window and runs the decode check whatever the windows show, so that a failing build's figures are complete."""
    groups = (windows[i:i + _WINDOWS_PER_CALL] for i in range(0, len(windows), _WINDOWS_PER_CALL))
    figures, complete = score_windows(windows, (list(zip(g, _windows_logits(engine, g))) for g in groups), reference,
                                      tie_epsilon, min_agreement, stop_early)
    if not complete:
        return GateResult(**figures, stopped_early=True)
    if stop_early and figures["tie_aware_agreement"] <= min_agreement:
        return GateResult(**figures)  # every window scored, and they fail: the decode check cannot change that
    return GateResult(**figures, **decode_check(engine, reference, prompts, tie_epsilon, min_agreement, max_seq_len,
                                                pool_tokens))


def score_windows(windows: list[list[int]], scored: Iterable[list[tuple[list[int], torch.Tensor]]],
                  reference: Reference, tie_epsilon: float, min_agreement: float,
                  stop_early: bool = True) -> tuple[dict[str, Any], bool]:
    """The teacher-forced windows' figures, whichever engine gave the logits: `scored` yields groups of (window,
    its logits [len - 1, vocab]) in the windows' order, computed as they are asked for. After each group, once the
    misses exceed what a pass over all of `windows` allows, no more is asked for (with `stop_early`). Returns the
    figures and whether every window was scored."""
    total = sum(len(w) - 1 for w in windows)
    allowed_misses = (1 - min_agreement) * total  # a pass needs misses < this
    raw = tie = offset = 0
    nll = kl = 0.0
    for group in scored:
        for window, logits in group:
            offset, agree, nll_w, kl_w = score_window(window, torch.log_softmax(logits, dim=-1), reference, offset,
                                                      tie_epsilon)
            raw, tie, nll, kl = raw + agree[0], tie + agree[1], nll + nll_w, kl + kl_w
        if stop_early and offset - tie >= allowed_misses and offset < total:
            break
    figures: dict[str, Any] = dict(
        tie_aware_agreement=tie / offset, raw_agreement=raw / offset, perplexity=math.exp(nll / offset),
        reference_perplexity=reference.perplexity, kl_divergence=kl / offset, positions=offset,
        tie_epsilon=tie_epsilon, min_agreement=min_agreement, tie_aware_interval=list(interval(tie, offset)))
    return figures, offset == total


def score_window(window: list[int], logprobs: torch.Tensor, reference: Reference, offset: int,
                 tie_epsilon: float) -> tuple[int, tuple[int, int], float, float]:
    """One window's positions against the reference; logprobs: [n, vocab]. Returns the new offset,
    (raw, tie-aware) agreeing positions, summed NLL and summed KL."""
    n = logprobs.shape[0]
    ref_ids = reference.top_ids[offset:offset + n]
    ref_lp = reference.top_logprobs[offset:offset + n]
    same, tie = agreeing(logprobs.argmax(-1), ref_ids, ref_lp, tie_epsilon)
    nll = -float(logprobs.gather(-1, torch.tensor(window[1:])[:, None]).sum())
    # KL(ref || cand) on the reference's top-K tokens plus one bucket for the rest: a lower bound of the full KL.
    p = ref_lp.exp()
    q = logprobs.gather(-1, ref_ids).exp()
    p_tail = (1 - p.sum(-1)).clamp(min=1e-12)
    q_tail = (1 - q.sum(-1)).clamp(min=1e-12)
    kl = float((p * (ref_lp - q.clamp(min=1e-30).log())).sum() + (p_tail * (p_tail / q_tail).log()).sum())
    return offset + n, (int(same.sum()), int(tie.sum())), nll, kl
