"""The engine against transformers: same greedy tokens, any batch size, page size and KV policy."""
from __future__ import annotations

import copy

import pytest
import torch
from model_factory import hf_greedy

from autotune.config.deploy import DeployConfig
from autotune.engine import Request, build_engine


def _prompts(vocab: int, lengths=(5, 17, 33, 9, 24)) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("batch_size", [1, 2, 5])
@pytest.mark.parametrize("page_size", [4, 16])
@pytest.mark.parametrize("policy", ["on_demand", "preallocate", "pool"])
def test_greedy_matches_transformers_fp32(tiny_llama, batch_size, page_size, policy):
    prompts = _prompts(tiny_llama.config.vocab_size)
    expected = hf_greedy(tiny_llama, prompts, 20)
    config = DeployConfig(batch_size=batch_size, page_size=page_size, kv_policy=policy, dtype="fp32")
    engine = build_engine(tiny_llama, config)
    runner = engine.runner(max_seq_len=64)
    outs = runner.run([Request(p, 20, min_new_tokens=20) for p in prompts])
    assert [o.output_ids for o in outs] == expected


@pytest.mark.slow
@pytest.mark.parametrize("level", ["O1", "O2"])
def test_compiled_segments_match_transformers(tiny_llama, level):
    prompts = _prompts(tiny_llama.config.vocab_size)
    expected = hf_greedy(tiny_llama, prompts, 12)
    config = DeployConfig(fusion_level=level, layers_per_subgraph=2, batch_size=4, page_size=8, dtype="fp32")
    engine = build_engine(tiny_llama, config)
    assert len(engine.model.segments) == 2
    outs = engine.runner(max_seq_len=64).run([Request(p, 12, min_new_tokens=12) for p in prompts])
    assert [o.output_ids for o in outs] == expected


def test_segments_follow_layers_per_subgraph(tiny_llama):
    from autotune.engine.model import EngineModel

    # 4 layers: None means all layers in one segment; a remainder makes a shorter last segment.
    for lps, sizes in ((1, [1, 1, 1, 1]), (2, [2, 2]), (3, [3, 1]), (None, [4])):
        model = EngineModel(tiny_llama, torch.float32, lps)
        assert [len(s.layers) for s in model.segments] == sizes
        assert [s.first_layer for s in model.segments] == [sum(sizes[:i]) for i in range(len(sizes))]


def test_batching_runs_batch_size_rows_together(tiny_llama):
    engine = build_engine(tiny_llama, DeployConfig(batch_size=3, dtype="fp32"))
    runner = engine.runner(max_seq_len=64)
    seen: list[int] = []
    original = engine.model.decode

    def spy(token_ids, *args, **kwargs):
        seen.append(token_ids.shape[0])
        return original(token_ids, *args, **kwargs)

    engine.model.decode = spy
    runner.run([Request(p, 6, min_new_tokens=6) for p in _prompts(512)])
    assert max(seen) == 3  # never more rows than the batch size, and it does fill it
    assert seen.count(3) >= 5


def test_stop_on_eos_and_sampling_is_seeded(tiny_llama):
    engine = build_engine(tiny_llama, DeployConfig(batch_size=2, dtype="fp32"))
    from autotune.engine import Sampling

    prompt = _prompts(512)[1]
    greedy = engine.runner(max_seq_len=64).run([Request(prompt, 10)])[0].output_ids
    eos = greedy[3]
    stopped = engine.runner(max_seq_len=64).run([Request(prompt, 10, eos_token_id=eos)])[0]
    assert stopped.output_ids == greedy[:greedy.index(eos) + 1] and stopped.finish_reason == "stop"
    s = Sampling(temperature=1.0, top_p=0.9, seed=7)
    a = engine.runner(max_seq_len=64).run([Request(prompt, 10, sampling=s)])[0].output_ids
    b = engine.runner(max_seq_len=64).run([Request(prompt, 10, sampling=s)])[0].output_ids
    assert a == b


def test_greedy_choices_depend_on_every_layer(tiny_llama):
    """Guards the fixture: the equality tests above mean something only if a wrong layer changes the greedy
    choices. With the embedding scaled up instead of peaked weights, every choice was the input token itself and
    zeroing any layer changed none of 64; here each changes 15 (the last layer's attention) to 64 of them."""
    ids = torch.tensor([t for p in _prompts(tiny_llama.config.vocab_size) for t in p][:64])[None]
    with torch.inference_mode():
        expected = tiny_llama(ids).logits.argmax(-1)
    for i in range(tiny_llama.config.num_hidden_layers):
        for part in ("self_attn.o_proj", "mlp.down_proj"):
            damaged = copy.deepcopy(tiny_llama)
            with torch.inference_mode():
                damaged.model.layers[i].get_submodule(part).weight.zero_()
                same = int((damaged(ids).logits.argmax(-1) == expected).sum())
            assert same < 56, f"layer {i} without {part}: {same} of 64 greedy choices unchanged"


@pytest.mark.parametrize("pad_batch", [False, True])
def test_greedy_rows_match_transformers_beside_sampled_and_forced_rows(tiny_llama, pad_batch):
    """Batch compositions: greedy rows share their steps with sampled rows (seeded or not, with top-p), a
    teacher-forced row and padded rows, at different rows as requests come and go; every greedy row's tokens are
    still transformers' own, the forced row logs the model's choices, and a seeded row draws what it draws alone."""
    from autotune.engine import Sampling

    prompts = _prompts(tiny_llama.config.vocab_size)
    expected = hf_greedy(tiny_llama, prompts, 12)
    engine = build_engine(tiny_llama, DeployConfig(batch_size=4, page_size=8, dtype="fp32"))
    seeded = Sampling(temperature=1.0, top_p=0.9, seed=3)
    alone = engine.runner(max_seq_len=64).run([Request(prompts[1], 12, min_new_tokens=12, sampling=seeded)])
    assert alone[0].output_ids != expected[1]  # it does sample: greedy tokens would pass trivially
    for order in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 0, 4, 1, 3]):
        requests = {0: Request(prompts[0], 12, min_new_tokens=12),
                    1: Request(prompts[1], 12, min_new_tokens=12, sampling=seeded),
                    2: Request(prompts[2], 7, min_new_tokens=7),
                    3: Request(prompts[3], 9, min_new_tokens=9, sampling=Sampling(temperature=0.8)),
                    4: Request(prompts[4], 12, min_new_tokens=12, forced_ids=tuple(expected[4]))}
        extra = [Request(prompts[3], 5, min_new_tokens=5, sampling=Sampling(temperature=1.5, top_p=0.5)),
                 Request(prompts[2], 12, min_new_tokens=12)]
        runner = engine.runner(max_seq_len=64, bucketed=pad_batch)
        runner.pad_batch = pad_batch  # an eager engine pads as a compiled one does
        outs = runner.run([requests[i] for i in order] + extra)
        by_prompt = dict(zip(order, outs))
        assert by_prompt[0].output_ids == expected[0] and by_prompt[2].output_ids == expected[2][:7], order
        assert outs[-1].output_ids == expected[2], order  # admitted late, into whatever row came free
        assert by_prompt[4].output_ids == by_prompt[4].greedy_ids == expected[4], order
        assert by_prompt[1].output_ids == alone[0].output_ids, order
        assert len(by_prompt[3].output_ids) == 9 and len(outs[-2].output_ids) == 5
