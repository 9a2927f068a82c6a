"""Decode in batch buckets and chunked prefill: the same greedy tokens as the full padded batch and the whole-prompt
prefill (and as transformers), with fewer padded rows and bounded prefill forwards."""
from __future__ import annotations

import pytest
import torch
from model_factory import hf_greedy, make_tiny

from autotune.config.deploy import DeployConfig
from autotune.engine import Request, build_engine
from autotune.engine.runner import batch_buckets

LENGTHS = (5, 17, 33, 9, 24)


pytestmark = pytest.mark.usefixtures("one_thread")


def _prompts(vocab: int, lengths=LENGTHS) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def _requests(prompts: list[list[int]], new: list[int], eos: int | None = None) -> list[Request]:
    return [Request(p, n, min_new_tokens=n, eos_token_id=eos) for p, n in zip(prompts, new)]


def _spy(model, name: str, seen: list, also=None) -> None:
    """Record the shape of each `name` forward's token ids, followed by `also()` when given."""
    original = getattr(model, name)

    def spy(token_ids, *args, **kwargs):
        seen.append((*token_ids.shape, also()) if also else tuple(token_ids.shape))
        return original(token_ids, *args, **kwargs)

    setattr(model, name, spy)


def test_buckets_are_powers_of_two_then_the_batch_size():
    assert batch_buckets(1) == (1,)
    assert batch_buckets(8) == (1, 2, 4, 8)
    assert batch_buckets(5) == (1, 2, 4, 5)


@pytest.mark.slow
@pytest.mark.parametrize("level", ["O0", "O1"])
def test_bucketed_decode_gives_the_tokens_of_the_full_padded_batch(tiny_llama, level):
    prompts = _prompts(tiny_llama.config.vocab_size, (*LENGTHS, 12))
    new = [12, 3, 7, 10, 5, 2]  # rows leave at different steps: the running batch shrinks through every bucket
    split = 2 if level != "O0" else None
    engine = build_engine(tiny_llama, DeployConfig(fusion_level=level, layers_per_subgraph=split, batch_size=8,
                                                dtype="fp32"))
    runner = engine.runner(max_seq_len=64, bucketed=True)
    runner.pad_batch = True  # an eager engine pads as a compiled one does
    seen: list = []
    _spy(engine.model, "decode", seen)
    bucketed = [c.output_ids for c in runner.run(_requests(prompts, new))]
    assert {shape[0] for shape in seen} == {1, 2, 4, 8}, seen
    full = engine.runner(max_seq_len=64)
    full.pad_batch = True  # the offline path: every step at the full batch
    seen.clear()
    padded = [c.output_ids for c in full.run(_requests(prompts, new))]
    assert {shape[0] for shape in seen} == {8}
    assert bucketed == padded == [row[:n] for row, n in zip(hf_greedy(tiny_llama, prompts, 12), new)]


@pytest.mark.slow
@pytest.mark.parametrize("level", ["O0", "O1"])
def test_serving_decode_reads_only_the_pages_its_rows_use(tiny_llama, level):
    """A serving runner's decode step is as wide as its longest row's pages (at least 2), not the whole context:
    the same tokens as the offline runner, which reads every page of the context each step. (That a width compiles
    no graph of its own: test_warm_up_compiles_every_graph_serving_meets.)"""
    prompts = _prompts(tiny_llama.config.vocab_size, (5, 17, 33))
    new = [6, 20, 12]  # rows leave at different steps: the widest row changes, and the width with it (5, 6, 4, 5)
    engine = build_engine(tiny_llama, DeployConfig(fusion_level=level, layers_per_subgraph=None if level == "O0"
                                                else 0, batch_size=4, page_size=8, dtype="fp32"))
    widths: list = []
    original = engine.model.decode

    def width(token_ids, positions, slots, block_table, context_mask, **kwargs):
        widths.append((block_table.shape[1], context_mask.shape[-1], kwargs["dynamic_context"]))
        return original(token_ids, positions, slots, block_table, context_mask, **kwargs)

    engine.model.decode = width
    serving = engine.runner(max_seq_len=64, bucketed=True)
    served = [c.output_ids for c in serving.run(_requests(prompts, new))]
    # Decode step k writes position prompt + k of each row that still runs (it has fewer than its new tokens).
    longest = [max(len(p) + k + 1 for p, n in zip(prompts, new) if k < n - 1) for k in range(max(new) - 1)]
    assert [w for w, _, _ in widths] == [max(2, -(-n // 8)) for n in longest]
    assert len({w for w, _, _ in widths}) > 1
    assert all(context == w * 8 and dynamic for w, context, dynamic in widths), widths
    widths.clear()
    offline = [c.output_ids for c in engine.runner(max_seq_len=64).run(_requests(prompts, new))]
    assert {w for w, _, _ in widths} == {8}
    assert served == offline == [row[:n] for row, n in zip(hf_greedy(tiny_llama, prompts, max(new)), new)]


@pytest.mark.parametrize("chunk", [8, 40])
def test_chunked_prefill_gives_the_tokens_of_whole_prompts(tiny_llama, chunk):
    prompts = _prompts(tiny_llama.config.vocab_size)
    new = [10, 6, 8, 12, 5]  # rows leave at different steps: later prompts arrive while others decode
    engine = build_engine(tiny_llama, DeployConfig(batch_size=2, page_size=4, dtype="fp32"))
    whole = [c.output_ids for c in engine.runner(max_seq_len=64).run(_requests(prompts, new))]
    runner = engine.runner(max_seq_len=64, prefill_chunk=chunk)
    forwards: list = []  # (rows, tokens, sequences decoding meanwhile)
    for name in ("prefill", "prefill_chunk"):
        _spy(engine.model, name, forwards, also=lambda: len(runner.scheduler.running))
    chunked = [c.output_ids for c in runner.run(_requests(prompts, new))]
    assert forwards[0] == (2, 17, 0)  # nothing decodes yet: both admitted prompts at once, over the budget
    while_decoding = [(rows, width) for rows, width, decoding in forwards if decoding]
    assert all(rows * width <= chunk for rows, width in while_decoding), forwards
    assert len(while_decoding) >= (6 if chunk == 8 else 2), forwards  # chunk 8: the 33 and 24 tokens split
    assert chunked == whole == [row[:n] for row, n in zip(hf_greedy(tiny_llama, prompts, 12), new)]


def test_decodes_run_between_the_chunks_of_a_long_prompt(tiny_llama):
    """A long prompt arriving while another request decodes costs that request one chunk per step, not the whole
    prompt: its tokens keep coming while the long prompt is prefilled."""
    vocab = tiny_llama.config.vocab_size
    short, long = _prompts(vocab, (6, 48))
    engine = build_engine(tiny_llama, DeployConfig(batch_size=2, page_size=16, dtype="fp32"))
    runner = engine.runner(max_seq_len=96, prefill_chunk=8)
    first = runner.submit(Request(short, 12, min_new_tokens=12))
    runner.step()
    second = runner.submit(Request(long, 4, min_new_tokens=4))
    produced = []
    while not second.output_ids:
        runner.step()
        produced.append(len(first.output_ids))
    assert len(produced) == 6 and produced == sorted(set(produced))  # 48 tokens in 6 chunks, a token each step
    while not (first.finish_reason and second.finish_reason):
        runner.step()
    alone = [c.output_ids for c in engine.runner(max_seq_len=96).run(
        [Request(short, 12, min_new_tokens=12), Request(long, 4, min_new_tokens=4)])]
    assert [first.output_ids, second.output_ids] == alone


@pytest.mark.parametrize("variant", ["mistral", "gemma2", "gemma3_text", "phi3"])
def test_chunked_prefill_keeps_windows_softcaps_and_local_rope(variant):
    model = make_tiny(variant)
    prompts = _prompts(model.config.vocab_size, (5, 17, 33, 12))
    expected = hf_greedy(model, prompts, 8)
    engine = build_engine(model, DeployConfig(batch_size=4, page_size=4, dtype="fp32"))
    eos = engine.model.eos_token_id
    runner = engine.runner(max_seq_len=64, prefill_chunk=6)
    assert [c.output_ids for c in runner.run(_requests(prompts, [8] * 4, eos))] == expected


def test_a_serving_thread_compiles_under_the_engines_settings(tiny_llama):
    """dynamo's and inductor's settings are per thread: the serving loop's thread takes the engine's, else its graphs
    were not frozen and beyond dynamo's default of 8 graphs a segment it ran eager."""
    import threading

    import torch._dynamo
    import torch._inductor.config

    engine = build_engine(tiny_llama, DeployConfig(fusion_level="O2", layers_per_subgraph=1, batch_size=8,
                                                dtype="fp32"))
    seen = {}

    def thread() -> None:
        before = (torch._dynamo.config.cache_size_limit, torch._inductor.config.freezing)
        engine.enter_thread()
        seen.update(before=before, after=(torch._dynamo.config.cache_size_limit, torch._inductor.config.freezing))

    worker = threading.Thread(target=thread)
    worker.start()
    worker.join()
    assert seen["before"] == (8, False)  # what a new thread gets: why enter_thread exists
    assert seen["after"][0] >= 4 * len(engine.model.segments) and seen["after"][1] is True


@pytest.mark.slow
def test_warm_up_compiles_every_graph_serving_meets(tiny_llama):
    """After warm_up, no request shape compiles a graph on a user's request: one prompt or several, a one-token
    prompt, a prompt longer than the prefill chunk (one that would leave a last chunk of one token), every bucket,
    decode steps 5 and 6 pages wide (warm-up meets 2 and 3)."""
    from torch._dynamo.utils import counters

    engine = build_engine(tiny_llama, DeployConfig(fusion_level="O1", layers_per_subgraph=0, batch_size=4, page_size=8,
                                                dtype="fp32"))
    runner = engine.runner(max_seq_len=64, prefill_chunk=16, bucketed=True)
    runner.warm_up(prompt_tokens=4)
    compiled = counters["stats"]["unique_graphs"]
    vocab = tiny_llama.config.vocab_size
    shapes = [(1,), (7,), (3, 11, 6), (17,), (33,), (2, 5, 9, 12), (40, 1)]
    for lengths in shapes:
        prompts = _prompts(vocab, lengths)
        runner.run(_requests(prompts, [3 + i for i in range(len(prompts))]))
    assert counters["stats"]["unique_graphs"] == compiled


def _seqs(lengths):
    from autotune.engine.sequence import Completion, Sequence

    return [Sequence(i, Completion(Request([1] * n, 4), arrival=0.0)) for i, n in enumerate(lengths)]


def test_length_groups_cut_padding_and_keep_two_prompts_a_group():
    from autotune.engine.scheduler import length_groups

    # The benchmark's 16 prompt lengths (SmolLM2, seed 0): one forward pads 12% of them, the groups under 5%.
    lengths = [136, 114, 144, 137, 142, 125, 120, 120, 128, 121, 118, 133, 118, 139, 125, 142]
    groups = length_groups(_seqs(lengths))
    assert sorted(s.prompt_len for g in groups for s in g) == sorted(lengths)  # every prompt, once
    padded = sum(len(g) * max(s.prompt_len for s in g) for g in groups)
    assert padded <= 1.05 * sum(lengths) and len(lengths) * max(lengths) > 1.1 * sum(lengths)
    assert len(groups) > 1 and all(len(g) >= 2 for g in groups)
    # A lone longest prompt joins the group before it rather than making a graph of one prompt.
    assert [len(g) for g in length_groups(_seqs([10, 10, 100]))] == [3]
    assert [len(g) for g in length_groups(_seqs([7]))] == [1]
    assert length_groups([]) == []


@pytest.mark.slow
def test_grouped_prefill_gives_the_tokens_of_one_forward(tiny_llama):
    """Prompts of spread lengths are prefilled in several forwards; the greedy tokens are transformers' own."""
    prompts = _prompts(tiny_llama.config.vocab_size, (5, 40, 6, 41, 7, 42))
    engine = build_engine(tiny_llama, DeployConfig(batch_size=8, dtype="fp32"))
    seen: list = []
    _spy(engine.model, "prefill", seen)
    out = [c.output_ids for c in engine.runner(max_seq_len=64).run(_requests(prompts, [6] * len(prompts)))]
    assert sorted(seen) == [(3, 7), (3, 42)], seen  # two forwards of three similar prompts
    assert out == hf_greedy(tiny_llama, prompts, 6)
