"""The next token of every row of a batch in one set of tensor ops: greedy, temperature and top-p, with end-of-sequence
masked before a row's minimum, and a seeded row drawing its noise from its own generator."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from autotune.engine.sequence import Sampling

__all__ = ["Sampler", "SamplingBatch"]

# Noise is clamped above 0: a draw of exactly 0 would make a token outside the nucleus (probability 0) 0/0 = NaN,
# which argmax picks.
_TINY = torch.finfo(torch.float32).tiny


@dataclass(frozen=True, slots=True)
class SamplingBatch:
    """What the sampler needs of each row, host-side (no device value is read to decide what to run).

    temperatures: 0 (or less) is greedy; top_ps: 1 keeps the whole distribution; generators: a seeded row's own,
    None draws from the batch's; banned: a token id the row may not choose yet (end-of-sequence before its
    min_new_tokens), or None."""

    temperatures: list[float]
    top_ps: list[float]
    generators: list[torch.Generator | None]
    banned: list[int | None]


class Sampler:
    """Chooses one token per row. Sampling draws with the exponential race (gpt-fast's no-sync multinomial):
    argmax(p / E), E ~ Exp(1) per token, picks token i with probability p_i, in one batched op; the chosen ids come
    to the host in one transfer. A row with a seed draws its E from its own generator, so that its tokens do not
    depend on its neighbours in the batch or its row; the other rows share one draw from the sampler's generator."""

    def __init__(self, device: torch.device | str = "cpu", seed: int = 0) -> None:
        self.device = torch.device(device)
        self._generator = torch.Generator(device=self.device)
        self._generator.manual_seed(seed)  # unseeded requests: the same run draws the same tokens

    def generator(self, sampling: Sampling) -> torch.Generator | None:
        """A seeded sampled request's own generator, on the logits' device; None otherwise."""
        if sampling.temperature <= 0 or sampling.seed is None:
            return None
        generator = torch.Generator(device=self.device)
        generator.manual_seed(sampling.seed)
        return generator

    @torch.inference_mode()  # logits are inference tensors: masking them in place needs the same mode
    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> list[int]:
        """logits: [rows (or more: padding), vocab] in fp32, masked in place. Returns one token id per row."""
        rows = len(batch.temperatures)
        logits = logits[:rows]
        banned = [(i, token) for i, token in enumerate(batch.banned) if token is not None]
        if banned:
            # As transformers' min_new_tokens does: end-of-sequence cannot be chosen before the minimum.
            index, tokens = zip(*banned)
            logits[list(index), list(tokens)] = float("-inf")
        greedy = logits.argmax(-1)
        sampled = [i for i, t in enumerate(batch.temperatures) if t > 0]
        if not sampled:  # the common case (benchmark, gate): no softmax, no noise
            return greedy.tolist()
        chosen = self._sample(logits, sampled, batch)
        if len(sampled) == rows:
            return chosen.tolist()
        return greedy.index_copy_(0, torch.tensor(sampled, device=logits.device), chosen).tolist()

    def _sample(self, logits: torch.Tensor, sampled: list[int], batch: SamplingBatch) -> torch.Tensor:
        """The sampled rows' choices: [len(sampled)] on the logits' device."""
        device = logits.device
        index = torch.tensor(sampled, device=device)
        temperatures = torch.tensor([batch.temperatures[i] for i in sampled], device=device)
        probs = torch.softmax(logits.index_select(0, index) / temperatures[:, None], dim=-1)  # [k, vocab]
        top_ps = [batch.top_ps[i] for i in sampled]
        if any(p < 1.0 for p in top_ps):
            # The nucleus: the most likely tokens until their mass reaches top_p (the token crossing it included).
            # A row at 1 keeps every token, even where rounding takes the cumulative sum past 1.
            limit = torch.tensor([p if p < 1.0 else math.inf for p in top_ps], device=device)
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            outside = sorted_probs.cumsum(-1) - sorted_probs >= limit[:, None]
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs.masked_fill_(outside, 0.0))
        noise = torch.empty_like(probs)
        generators = [batch.generators[i] for i in sampled]
        if any(g is None for g in generators):
            noise.exponential_(generator=self._generator)  # one draw for the batch; seeded rows overwrite theirs
        for row, generator in enumerate(generators):
            if generator is not None:
                noise[row].exponential_(generator=generator)  # [vocab] from the row's own stream, wherever it sits
        return (probs / noise.clamp_min_(_TINY)).argmax(-1)
