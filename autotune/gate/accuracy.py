"""The accuracy gate: teacher-forced agreement with the full-precision reference, plus perplexity, KL and drift."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from autotune.engine import Engine, Request

__all__ = ["Reference", "GateResult", "compute_reference", "evaluate_gate", "TOP_K"]

# Reference distributions are kept as their top-K: enough to decide near-ties and most of the KL mass.
TOP_K = 64


@dataclass(slots=True)
class Reference:
    """What the gate needs of the reference model, per predicted position (cached on disk)."""

    top_ids: torch.Tensor  # [positions, TOP_K] int64
    top_logprobs: torch.Tensor  # [positions, TOP_K] float32
    target_logprobs: torch.Tensor  # [positions]: log p(actual next token)
    drift_tokens: list[list[int]]  # greedy continuations of the drift prompts

    @property
    def perplexity(self) -> float:
        return math.exp(-self.target_logprobs.mean().item())


@dataclass(slots=True)
class GateResult:
    tie_aware_agreement: float
    raw_agreement: float
    perplexity: float
    reference_perplexity: float
    kl_divergence: float
    drift_agreement: float
    drift_first_divergence: int
    positions: int
    tie_epsilon: float
    min_agreement: float

    @property
    def passed(self) -> bool:
        return self.tie_aware_agreement > self.min_agreement

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


@torch.inference_mode()
def compute_reference(hf_model, windows: list[list[int]], drift_prompts: list[list[int]],
                      drift_tokens: int) -> Reference:
    """hf_model: transformers' model in fp32, eager: the canonical implementation is the reference."""
    tops, top_lps, targets = [], [], []
    for window in windows:
        ids = torch.tensor([window])
        logprobs = torch.log_softmax(hf_model(ids).logits[0, :-1].float(), dim=-1)
        lp, idx = logprobs.topk(TOP_K, dim=-1)
        tops.append(idx)
        top_lps.append(lp)
        targets.append(logprobs.gather(-1, ids[0, 1:, None]).squeeze(-1))
    drift = []
    for prompt in drift_prompts:
        out = hf_model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                max_new_tokens=drift_tokens, min_new_tokens=drift_tokens, do_sample=False)
        drift.append(out[0, len(prompt):].tolist())
    return Reference(torch.cat(tops), torch.cat(top_lps), torch.cat(targets), drift)


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


def evaluate_gate(engine: Engine, reference: Reference, windows: list[list[int]], drift_prompts: list[list[int]],
                  *, tie_epsilon: float = 0.05, min_agreement: float = 0.995, max_seq_len: int = 0) -> GateResult:
    """Run the candidate over the same text; a position agrees when the candidate's top-1 is the reference's,
    or the reference gives it a probability within tie_epsilon of its own top-1 (the reference was undecided)."""
    raw = tie = 0
    nll = kl = 0.0
    offset = 0
    for i in range(0, len(windows), _WINDOWS_PER_CALL):
        group = windows[i:i + _WINDOWS_PER_CALL]
        for window, logits in zip(group, _windows_logits(engine, group)):
            offset, agree, nll_w, kl_w = _score(window, torch.log_softmax(logits, dim=-1), reference, offset,
                                                tie_epsilon)
            raw += agree[0]
            tie += agree[1]
            nll += nll_w
            kl += kl_w
    matches, first = _drift(engine, reference, drift_prompts, max_seq_len)
    return GateResult(
        tie_aware_agreement=tie / offset, raw_agreement=raw / offset, perplexity=math.exp(nll / offset),
        reference_perplexity=reference.perplexity, kl_divergence=kl / offset, drift_agreement=matches,
        drift_first_divergence=first, positions=offset, tie_epsilon=tie_epsilon, min_agreement=min_agreement,
    )


def _score(window: list[int], logprobs: torch.Tensor, reference: Reference, offset: int,
           tie_epsilon: float) -> tuple[int, tuple[int, int], float, float]:
    """One window's positions against the reference; logprobs: [n, vocab]. Returns the new offset,
    (raw, tie-aware) agreeing positions, summed NLL and summed KL."""
    n = logprobs.shape[0]
    ref_ids = reference.top_ids[offset:offset + n]
    ref_lp = reference.top_logprobs[offset:offset + n]
    cand_top = logprobs.argmax(-1)
    same = cand_top == ref_ids[:, 0]
    # p_ref(candidate's top-1); a token outside the reference's top-K is no closer than its K-th.
    hit = ref_ids == cand_top[:, None]
    p_ref_cand = torch.where(hit.any(-1), (ref_lp.exp() * hit).sum(-1), torch.zeros(n))
    tie = int((same | (p_ref_cand >= ref_lp[:, 0].exp() - tie_epsilon)).sum())
    nll = -float(logprobs.gather(-1, torch.tensor(window[1:])[:, None]).sum())
    # KL(ref || cand) on the reference's top-K tokens plus one bucket for the rest: a lower bound of the full KL.
    p = ref_lp.exp()
    q = logprobs.gather(-1, ref_ids).exp()
    p_tail = (1 - p.sum(-1)).clamp(min=1e-12)
    q_tail = (1 - q.sum(-1)).clamp(min=1e-12)
    kl = float((p * (ref_lp - q.clamp(min=1e-30).log())).sum() + (p_tail * (p_tail / q_tail).log()).sum())
    return offset + n, (int(same.sum()), tie), nll, kl


def _drift(engine: Engine, reference: Reference, prompts: list[list[int]], max_seq_len: int) -> tuple[float, int]:
    new = len(reference.drift_tokens[0])
    # The configuration's own batch size and the benchmark's sequence length: compiled decode graphs are then
    # the ones the benchmark uses, not new shapes to compile.
    runner = engine.runner(max_seq_len=max(max_seq_len, max(map(len, prompts)) + new))
    eos = engine.model.eos_token_id
    outs = runner.run([Request(p, new, min_new_tokens=new, eos_token_id=eos) for p in prompts])
    agree = first = 0
    first = new
    for out, ref in zip(outs, reference.drift_tokens):
        same = [a == b for a, b in zip(out.output_ids, ref)]
        agree += sum(same)
        first = min(first, same.index(False) if False in same else new)
    return agree / (new * len(prompts)), first
