"""The batched sampler: a seeded row's tokens do not depend on its neighbours or its row, top-p keeps to the nucleus,
a vanishing temperature is greedy, end-of-sequence is masked, and the chosen ids come to the host in one transfer."""
from __future__ import annotations

import pytest
import torch

from autotune.engine import Sampling
from autotune.engine.sampler import Sampler, SamplingBatch

VOCAB = 1000


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def _batch(temperatures, top_ps=None, generators=None, banned=None) -> SamplingBatch:
    n = len(temperatures)
    return SamplingBatch(list(temperatures), list(top_ps or [1.0] * n), list(generators or [None] * n),
                         list(banned or [None] * n))


def test_a_seeded_row_draws_the_same_tokens_whatever_its_neighbours_and_row():
    sampling = Sampling(temperature=0.9, top_p=0.95, seed=7)
    steps = [_logits(1, seed=s)[0] for s in range(40)]  # the seeded row's logits, step by step

    def alone() -> list[int]:
        sampler, own = Sampler(), Sampler().generator(sampling)
        return [sampler(row[None].clone(), _batch([0.9], [0.95], [own]))[0] for row in steps]

    def in_a_batch(position: int, seed: int) -> list[int]:
        sampler, own = Sampler(seed=seed), Sampler().generator(sampling)
        other = Sampler().generator(Sampling(temperature=1.0, seed=123))
        out = []
        for s, row in enumerate(steps):
            logits = _logits(4, seed=1000 + s)
            logits[position] = row
            # Neighbours: greedy, unseeded sampled (the batch's draw), another seeded row; one with top-p.
            temperatures, top_ps, generators = [0.0, 1.0, 1.0, 0.7], [1.0, 1.0, 0.5, 1.0], [None, None, other, None]
            temperatures[position], top_ps[position], generators[position] = 0.9, 0.95, own
            out.append(sampler(logits, _batch(temperatures, top_ps, generators))[position])
        return out

    expected = alone()
    assert len(set(expected)) > 10  # it does sample: a fixed choice would pass trivially
    for position, seed in ((0, 0), (2, 5), (3, 9)):
        assert in_a_batch(position, seed) == expected, position


def test_top_p_never_leaves_the_nucleus_and_draws_in_proportion():
    # Sorted mass before each token: 0, .5, .8, .95: at top_p .7 the nucleus is tokens 0 and 1 (the token crossing
    # .7 is included), renormalised to .625 / .375.
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    rows = 4000
    logits = probs.log().expand(rows, -1).clone()
    chosen = torch.tensor(Sampler(seed=3)(logits, _batch([1.0] * rows, [0.7] * rows)))
    assert set(chosen.tolist()) == {0, 1}
    assert abs(float((chosen == 0).float().mean()) - 0.625) < 0.03
    # Without top-p every token is drawn, each about as often as its probability.
    chosen = torch.tensor(Sampler(seed=4)(probs.log().expand(rows, -1).clone(), _batch([1.0] * rows)))
    counts = torch.bincount(chosen, minlength=4) / rows
    assert torch.allclose(counts, probs, atol=0.03), counts
    # A seeded row at top_p .5: the first token alone (the mass before the second is .5, not below it).
    seeded = Sampler().generator(Sampling(temperature=1.0, seed=1))
    picks = {Sampler()(probs.log()[None].clone(), _batch([1.0], [0.5], [seeded]))[0] for _ in range(200)}
    assert picks == {0}


def test_a_vanishing_temperature_is_greedy():
    logits = _logits(16)
    top2 = logits.topk(2).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 1e-3  # decided rows: greedy is well defined
    greedy = Sampler()(logits.clone(), _batch([0.0] * 16))
    assert greedy == logits.argmax(-1).tolist()
    assert Sampler()(logits.clone(), _batch([1e-6] * 16, [0.9] * 16)) == greedy
    generators = [Sampler().generator(Sampling(temperature=1e-6, seed=i)) for i in range(16)]
    assert Sampler()(logits.clone(), _batch([1e-6] * 16, generators=generators)) == greedy


def test_end_of_sequence_is_masked_before_the_minimum():
    logits = _logits(8)
    logits[:, 5] = 100.0  # token 5 would win everywhere
    banned = [5, None] * 4
    chosen = Sampler()(logits.clone(), _batch([0.0, 0.0, 1.0, 1.0] * 2, banned=banned))
    runner_up = logits.index_fill(1, torch.tensor([5]), float("-inf")).argmax(-1)
    assert [chosen[0], chosen[4]] == [int(runner_up[0]), int(runner_up[4])]  # greedy: the best of the rest
    assert all(chosen[i] != 5 for i in (0, 2, 4, 6)) and all(chosen[i] == 5 for i in (1, 3, 5, 7))


def test_padding_rows_are_ignored():
    logits = _logits(8)
    assert Sampler()(logits.clone(), _batch([0.0] * 3)) == logits[:3].argmax(-1).tolist()


def test_a_batched_call_makes_one_host_transfer(monkeypatch):
    """Every row of a mixed batch (greedy, banned, sampled with and without seed, top-p), and the ids come to the
    host once: no per-row .item()/.tolist() (on an accelerator each is a device sync)."""
    calls: list[str] = []
    for name in ("tolist", "item", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    generators = [None, None, Sampler().generator(Sampling(temperature=1.0, seed=2)), None, None,
                  Sampler().generator(Sampling(temperature=0.5, seed=3))]
    batch = _batch([0.0, 0.0, 1.0, 0.8, 1.2, 0.5], [1.0, 1.0, 0.9, 1.0, 0.6, 0.3], generators,
                   [None, 7, None, 7, None, None])
    chosen = Sampler()(_logits(8), batch)
    assert len(chosen) == 6 and calls == ["tolist"]
    calls.clear()
    Sampler()(_logits(8), _batch([0.0] * 6, banned=[3] * 6))  # all greedy
    assert calls == ["tolist"]


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_noise_of_zero_cannot_pick_a_token_outside_the_nucleus(temperature, monkeypatch):
    """An exponential draw of exactly 0 would make an excluded token 0/0 = NaN, which argmax picks."""
    original = torch.Tensor.exponential_

    def zeros(self, *args, **kwargs):
        return original(self, *args, **kwargs).zero_()

    monkeypatch.setattr(torch.Tensor, "exponential_", zeros)
    probs = torch.tensor([0.6, 0.3, 0.1])
    chosen = Sampler()(probs.log()[None].expand(4, -1).clone() * temperature, _batch([temperature] * 4, [0.5] * 4))
    assert chosen == [0] * 4
