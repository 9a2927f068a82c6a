"""The accuracy gate: teacher-forced agreement with the full-precision reference, plus perplexity, KL and drift."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch

from autotune.engine import Engine, Request

__all__ = ["Reference", "GateResult", "compute_reference", "evaluate_gate", "decode_check", "TOP_K"]

# Reference distributions are kept as their top-K: enough to decide near-ties and most of the KL mass.
TOP_K = 64


@dataclass(slots=True)
class Reference:
    """What the gate needs of the reference model, per predicted position (cached on disk)."""

    top_ids: torch.Tensor  # [positions, TOP_K] int64
    top_logprobs: torch.Tensor  # [positions, TOP_K] float32
    target_logprobs: torch.Tensor  # [positions]: log p(actual next token)
    drift_tokens: list[list[int]]  # greedy continuations of the drift prompts
    drift_top_ids: torch.Tensor  # [prompts, drift_tokens, TOP_K]: the reference's choices along its continuation
    drift_top_logprobs: torch.Tensor  # [prompts, drift_tokens, TOP_K]

    @property
    def perplexity(self) -> float:
        return math.exp(-self.target_logprobs.mean().item())


@dataclass(slots=True)
class GateResult:
    """`tie_aware_agreement` is teacher-forced over the evaluation windows (prefill); `decode_agreement` is the
    same measure through the configuration's own decode path, at its batch size and page size, teacher-forced
    along the reference's greedy continuation of the drift prompts. Both must exceed `min_agreement`.
    `stopped_early`: the windows already held more misses than a pass allows, so the rest was not run."""

    tie_aware_agreement: float
    raw_agreement: float
    perplexity: float
    reference_perplexity: float
    kl_divergence: float
    positions: int
    tie_epsilon: float
    min_agreement: float
    decode_agreement: float | None = None
    decode_raw_agreement: float | None = None
    decode_positions: int = 0
    decode_first_miss: int | None = None  # first continuation token where a decided choice was lost
    stopped_early: bool = False

    @property
    def passed(self) -> bool:
        if self.stopped_early or self.tie_aware_agreement <= self.min_agreement:
            return False
        return self.decode_agreement is None or self.decode_agreement > self.min_agreement

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}

    @classmethod
    def from_dict(cls, figures: dict) -> GateResult:
        return cls(**{f.name: figures[f.name] for f in fields(cls) if f.name in figures})


def _top(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [..., vocab] -> (top ids, top log-probabilities), each [..., TOP_K]."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    lp, idx = logprobs.topk(TOP_K, dim=-1)
    return idx, lp


@torch.inference_mode()
def compute_reference(hf_model, windows: list[list[int]], drift_prompts: list[list[int]],
                      drift_tokens: int) -> Reference:
    """hf_model: transformers' model in fp32, eager: the canonical implementation is the reference."""
    tops, top_lps, targets = [], [], []
    for window in windows:
        ids = torch.tensor([window])
        logits = hf_model(ids).logits[0, :-1]
        idx, lp = _top(logits)
        tops.append(idx)
        top_lps.append(lp)
        targets.append(torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1))
    # Prompts of one length are generated together (no padding, so nothing changes but the speed: 8 prompts at
    # once instead of one after another).
    by_length: dict[int, list[int]] = {}
    for i, prompt in enumerate(drift_prompts):
        by_length.setdefault(len(prompt), []).append(i)
    drift: list[list[int]] = [[] for _ in drift_prompts]
    drift_ids: list[torch.Tensor] = [torch.empty(0)] * len(drift_prompts)
    drift_lps: list[torch.Tensor] = [torch.empty(0)] * len(drift_prompts)
    for length, rows in by_length.items():
        ids = torch.tensor([drift_prompts[i] for i in rows])
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=drift_tokens,
                                min_new_tokens=drift_tokens, do_sample=False, output_scores=True,
                                return_dict_in_generate=True)
        # The scores are after the logits processors (end-of-sequence masked before min_new_tokens), as the
        # engine's runner masks them: both sides choose among the same tokens. scores: steps x [rows, vocab].
        idx, lp = _top(torch.stack(out.scores, dim=1))
        for j, i in enumerate(rows):
            drift[i] = out.sequences[j, length:].tolist()
            drift_ids[i], drift_lps[i] = idx[j], lp[j]
    return Reference(torch.cat(tops), torch.cat(top_lps), torch.cat(targets), drift, torch.stack(drift_ids),
                     torch.stack(drift_lps))


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


def _agreeing(cand_top: torch.Tensor, ref_ids: torch.Tensor, ref_lp: torch.Tensor,
              tie_epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position: (raw agreement, tie-aware agreement) of the candidate's top-1 with the reference's.
    cand_top: [n]; ref_ids, ref_lp: [n, TOP_K]."""
    same = cand_top == ref_ids[:, 0]
    # p_ref(candidate's top-1); a token outside the reference's top-K is no closer than its K-th.
    hit = ref_ids == cand_top[:, None]
    p_ref_cand = torch.where(hit.any(-1), (ref_lp.exp() * hit).sum(-1), torch.zeros(len(cand_top)))
    return same, same | (p_ref_cand >= ref_lp[:, 0].exp() - tie_epsilon)


def evaluate_gate(engine: Engine, reference: Reference, windows: list[list[int]], drift_prompts: list[list[int]],
                  *, tie_epsilon: float = 0.05, min_agreement: float = 0.995, max_seq_len: int = 0,
                  pool_tokens: int | None = None) -> GateResult:
    """Run the candidate over the same text; a position agrees when the candidate's top-1 is the reference's,
    or the reference gives it a probability within tie_epsilon of its own top-1 (the reference was undecided).

    Staged: the windows are scored in turn, and once they hold more misses than a pass over all of them allows,
    the gate stops (a certain fail: no remaining window could bring it back). A pass is always decided on every
    window and on the decode check. `max_seq_len` and `pool_tokens` are the benchmark's, so that the decode check
    runs (and compiles) the very graphs the benchmark will use."""
    total = sum(len(w) - 1 for w in windows)
    allowed_misses = (1 - min_agreement) * total  # a pass needs misses < this
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
        if offset - tie >= allowed_misses and offset < total:
            return GateResult(tie_aware_agreement=tie / offset, raw_agreement=raw / offset,
                              perplexity=math.exp(nll / offset), reference_perplexity=reference.perplexity,
                              kl_divergence=kl / offset, positions=offset, tie_epsilon=tie_epsilon,
                              min_agreement=min_agreement, stopped_early=True)
    decode = decode_check(engine, reference, drift_prompts, tie_epsilon, max_seq_len, pool_tokens)
    return GateResult(
        tie_aware_agreement=tie / offset, raw_agreement=raw / offset, perplexity=math.exp(nll / offset),
        reference_perplexity=reference.perplexity, kl_divergence=kl / offset, positions=offset,
        tie_epsilon=tie_epsilon, min_agreement=min_agreement, **decode,
    )


def _score(window: list[int], logprobs: torch.Tensor, reference: Reference, offset: int,
           tie_epsilon: float) -> tuple[int, tuple[int, int], float, float]:
    """One window's positions against the reference; logprobs: [n, vocab]. Returns the new offset,
    (raw, tie-aware) agreeing positions, summed NLL and summed KL."""
    n = logprobs.shape[0]
    ref_ids = reference.top_ids[offset:offset + n]
    ref_lp = reference.top_logprobs[offset:offset + n]
    same, tie = _agreeing(logprobs.argmax(-1), ref_ids, ref_lp, tie_epsilon)
    nll = -float(logprobs.gather(-1, torch.tensor(window[1:])[:, None]).sum())
    # KL(ref || cand) on the reference's top-K tokens plus one bucket for the rest: a lower bound of the full KL.
    p = ref_lp.exp()
    q = logprobs.gather(-1, ref_ids).exp()
    p_tail = (1 - p.sum(-1)).clamp(min=1e-12)
    q_tail = (1 - q.sum(-1)).clamp(min=1e-12)
    kl = float((p * (ref_lp - q.clamp(min=1e-30).log())).sum() + (p_tail * (p_tail / q_tail).log()).sum())
    return offset + n, (int(same.sum()), int(tie.sum())), nll, kl


def decode_check(engine: Engine, reference: Reference, prompts: list[list[int]], tie_epsilon: float,
                  max_seq_len: int, pool_tokens: int | None) -> dict:
    """Teacher-forced through the deployed decode path: each drift prompt is prefilled, then the reference's own
    continuation is fed token by token, and at every step the candidate's greedy choice is scored as in the
    windows. Forced tokens keep both sides on one prefix, so a lost decision is counted where it happens instead of
    ending the comparison (a free-running continuation forks at the first near-tie and says little after it).
    The prompts fill the configuration's batch (repeated when it is larger), so the decode graphs run at its batch
    size, over its page size, as in the benchmark."""
    new = reference.drift_top_ids.shape[1]
    batch = engine.config.batch_size
    rows = [i % len(prompts) for i in range(max(batch, len(prompts)))]
    runner = engine.runner(max_seq_len=max(max_seq_len, max(map(len, prompts)) + new), pool_tokens=pool_tokens)
    eos = engine.model.eos_token_id
    outs = runner.run([Request(prompts[i], new, min_new_tokens=new, eos_token_id=eos,
                               forced_ids=tuple(reference.drift_tokens[i])) for i in rows])
    raw = tie = 0
    first_miss: int | None = None
    seen: set[int] = set()
    for i, out in zip(rows, outs):
        if i in seen:  # a repeated prompt filled the batch: scored once
            continue
        seen.add(i)
        same, agree = _agreeing(torch.tensor(out.greedy_ids), reference.drift_top_ids[i],
                                reference.drift_top_logprobs[i], tie_epsilon)
        raw += int(same.sum())
        tie += int(agree.sum())
        misses = (~agree).nonzero()
        if len(misses):
            first_miss = int(misses[0]) if first_miss is None else min(first_miss, int(misses[0]))
    positions = new * len(seen)
    return {"decode_agreement": tie / positions, "decode_raw_agreement": raw / positions,
            "decode_positions": positions, "decode_first_miss": first_miss}
