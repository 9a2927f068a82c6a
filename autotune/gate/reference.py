"""What the gate compares against: the fp32 reference's top-K distributions over the evaluation windows and along
its own greedy continuation of the decode prompts, and how one position is scored against them."""
from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from autotune.gate.cache import holdout_reference_path, reference_path
from autotune.gate.corpus import decode_prompts, eval_set_digest, eval_windows, holdout_prompts
from autotune.gate.design import DECODE_NEW_TOKENS, TOP_K

__all__ = ["Reference", "compute_reference", "cached_reference", "cached_holdout_reference", "agreeing", "top"]

# Decode prompts generated together by the reference (they are of one length): the scores of one group are
# [rows, steps, vocab] floats, about 200 MB for 32 rows of SmolLM2.
_REFERENCE_ROWS = 32


@dataclass(slots=True)
class Reference:
    """What the gate needs of the reference model, per predicted position (cached on disk)."""

    top_ids: torch.Tensor  # [positions, TOP_K] int64
    top_logprobs: torch.Tensor  # [positions, TOP_K] float32
    target_logprobs: torch.Tensor  # [positions]: log p(actual next token)
    decode_tokens: list[list[int]]  # greedy continuations of the decode prompts
    decode_top_ids: torch.Tensor  # [prompts, new tokens, TOP_K]: the reference's choices along its continuation
    decode_top_logprobs: torch.Tensor  # [prompts, new tokens, TOP_K]

    @property
    def perplexity(self) -> float:
        return math.exp(-self.target_logprobs.mean().item())


def top(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [..., vocab] -> (top ids, top log-probabilities), each [..., TOP_K]."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    lp, idx = logprobs.topk(TOP_K, dim=-1)
    return idx, lp


@torch.inference_mode()
def compute_reference(hf_model, windows: list[list[int]], prompts: list[list[int]],
                      new_tokens: int = DECODE_NEW_TOKENS) -> Reference:
    """hf_model: transformers' model in fp32, eager: the canonical implementation is the reference."""
    tops, top_lps, targets = [], [], []
    for window in windows:
        ids = torch.tensor([window])
        logits = hf_model(ids).logits[0, :-1]
        idx, lp = top(logits)
        tops.append(idx)
        top_lps.append(lp)
        targets.append(torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1))
    # Prompts of one length are generated together (no padding, so nothing changes but the speed).
    by_length: dict[int, list[int]] = {}
    for i, prompt in enumerate(prompts):
        by_length.setdefault(len(prompt), []).append(i)
    tokens: list[list[int]] = [[] for _ in prompts]
    top_ids: list[torch.Tensor] = [torch.empty(0)] * len(prompts)
    top_lps_d: list[torch.Tensor] = [torch.empty(0)] * len(prompts)
    for length, same_length in by_length.items():
        for start in range(0, len(same_length), _REFERENCE_ROWS):
            rows = same_length[start:start + _REFERENCE_ROWS]
            ids = torch.tensor([prompts[i] for i in rows])
            out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                    min_new_tokens=new_tokens, do_sample=False, output_scores=True,
                                    return_dict_in_generate=True)
            # The scores are after the logits processors (end-of-sequence masked before min_new_tokens), as the
            # engine's runner masks them: both sides choose among the same tokens. scores: steps x [rows, vocab].
            idx, lp = top(torch.stack(out.scores, dim=1))
            for j, i in enumerate(rows):
                tokens[i] = out.sequences[j, length:].tolist()
                top_ids[i], top_lps_d[i] = idx[j], lp[j]
    if not windows:  # the held-back reference: continuations only
        tops, top_lps, targets = [torch.empty(0, TOP_K, dtype=torch.long)], [torch.empty(0, TOP_K)], [torch.empty(0)]
    return Reference(torch.cat(tops), torch.cat(top_lps), torch.cat(targets), tokens, torch.stack(top_ids),
                     torch.stack(top_lps_d))


def agreeing(cand_top: torch.Tensor, ref_ids: torch.Tensor, ref_lp: torch.Tensor,
             tie_epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position: (raw agreement, tie-aware agreement) of the candidate's top-1 with the reference's.
    cand_top: [n]; ref_ids, ref_lp: [n, TOP_K]. A position agrees tie-aware when the candidate's top-1 is the
    reference's, or the reference gives it a probability within tie_epsilon of its own top-1."""
    same = cand_top == ref_ids[:, 0]
    # p_ref(candidate's top-1); a token outside the reference's top-K is no closer than its K-th.
    hit = ref_ids == cand_top[:, None]
    p_ref_cand = torch.where(hit.any(-1), (ref_lp.exp() * hit).sum(-1), torch.zeros(len(cand_top)))
    return same, same | (p_ref_cand >= ref_lp[:, 0].exp() - tie_epsilon)


def cached_reference(checksum: str, tokenizer, positions: int, load_fp32: Callable[[], object]) -> Reference:
    """The reference from the cache (its key: autotune/gate/cache.py), computed and stored first when missing;
    `load_fp32` loads transformers' fp32 model only then."""
    path = reference_path(checksum, eval_set_digest(positions))
    return _cached(path, lambda: compute_reference(load_fp32(), eval_windows(tokenizer, positions),
                                                   decode_prompts(tokenizer, eval_positions=positions)))


def cached_holdout_reference(checksum: str, tokenizer, load_fp32: Callable[[], object]) -> Reference:
    """The reference's continuations of the held-back prompts (no windows), cached apart from the gate's."""
    return _cached(holdout_reference_path(checksum),
                   lambda: compute_reference(load_fp32(), [], holdout_prompts(tokenizer)))


def _cached(path, compute: Callable[[], Reference]) -> Reference:
    if not path.is_file():
        ref = compute()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save(asdict(ref), tmp)
        tmp.replace(path)  # atomic: concurrent workers never read half a file
    return Reference(**torch.load(path))
