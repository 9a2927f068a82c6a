"""Continuous batching: each step admits what fits (engine/scheduler.py), runs one prefill forward and one decode step
of every running row on inputs prepared as whole tensors, and samples each row's next token (engine/sampler.py)."""
from __future__ import annotations

import time

import torch

from autotune.engine.kv_cache import PagedKVCache
from autotune.engine.model import EngineModel
from autotune.engine.sampler import Sampler, SamplingBatch
from autotune.engine.scheduler import PrefillBatch, Scheduler, length_groups
from autotune.engine.sequence import Completion, Request, Sampling, Sequence
from autotune.engine.stepped import SteppedRunner

# Request, Completion and Sampling live in engine/sequence.py; named here too, where they were first defined.
__all__ = ["Runner", "batch_buckets", "Request", "Completion", "Sampling"]


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Row counts a padded decode step runs at: the powers of two below `max_batch`, then `max_batch`. A compiled
    engine keeps one graph per bucket, so that one running request pays for one row, not for `max_batch`."""
    sizes, n = [], 1
    while n < max_batch:
        sizes.append(n)
        n *= 2
    return (*sizes, max_batch)


class Runner(SteppedRunner):
    """Runs requests through an EngineModel with a paged cache, `max_batch` sequences at a time.

    `pad_batch` pads every decode step to the smallest of `batch_buckets(max_batch)` that holds its rows (static
    shapes for compiled graphs, a few of them); padded rows write to the cache's scratch page and are ignored.
    `bucketed` False: one bucket, `max_batch`.
    `prefill_chunk` bounds the prompt tokens one step prefills (padding counted) while other sequences decode, so
    that new prompts delay the running decodes by one bounded forward a step: fresh prompts that fit are prefilled
    together, a longer one a chunk per step, attending to its earlier chunks in the cache. None, or no sequence
    decoding: every admitted prompt at once (a burst of arrivals is prefilled as the offline benchmark does).
    `dynamic_context`: a decode step's block table is as wide as its longest row's pages, not the whole context
    (`_decode_pages`)."""

    def __init__(self, model: EngineModel, cache: PagedKVCache, max_batch: int, pad_batch: bool = False,
                 prefill_chunk: int | None = None, bucketed: bool = False, dynamic_context: bool = False,
                 min_bucket: int = 1) -> None:
        self.scheduler = Scheduler(cache, max_batch, prefill_chunk)
        self.model, self.cache, self.max_batch, self.pad_batch = model, cache, max_batch, pad_batch
        # Offline (benchmark, gate) one bucket: the batch stays full but for its tail, and every extra graph is
        # compile time inside a trial (and under O2 a frozen copy of the weights); serving, where few requests
        # often run, pays that once at start-up.
        # `min_bucket`: where one graph serves every batch from 2 rows (O2's packages: engine/packaged.py), a lone
        # row is padded to 2 rather than given a graph of its own, compiled at start-up.
        self.buckets = tuple(b for b in batch_buckets(max_batch) if b >= min(min_bucket, max_batch)) if bucketed \
            else (max_batch,)
        self._lone_padded = bucketed and self.buckets[0] > 1
        self.dynamic_context = dynamic_context
        self.sampler = Sampler(model.lm_head.weight.device)  # where the logits are: the noise is drawn there
        model.attach(cache)

    @property
    def peak_running(self) -> int:
        """The most sequences admitted at once since it was last set to 0 (the benchmark's concurrency)."""
        return self.scheduler.peak_running

    @peak_running.setter
    def peak_running(self, value: int) -> None:
        self.scheduler.peak_running = value

    @property
    def prefill_chunk(self) -> int | None:
        return self.scheduler.prefill_chunk

    # -- inputs ---------------------------------------------------------------------------------------------------
    def prepare_prefill(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Whole prompts from position 0, right-padded: token ids and slots [seqs, longest prompt], lengths [seqs].
        Padded positions write to slot 0 (the scratch page)."""
        cache = self.cache
        prompts = [s.request.prompt_ids for s in seqs]
        width = max(map(len, prompts))
        if self.pad_batch:
            width = max(width, 2)  # dynamo specialises a length of 1: one more graph, compiled on a user's request
        ids = torch.tensor([p + [0] * (width - len(p)) for p in prompts])
        lengths = torch.tensor([len(p) for p in prompts])
        table = torch.tensor([cache.block_row(s.seq_id) for s in seqs])  # [seqs, pages_per_seq]
        positions = torch.arange(width)
        slots = table[:, positions // cache.page_size] * cache.page_size + positions % cache.page_size
        slots.masked_fill_(positions >= lengths[:, None], 0)
        return ids, slots, lengths

    def prepare_prefill_chunk(self, seq: Sequence, end: int) -> tuple[torch.Tensor, ...]:
        """Prompt positions [seq.length, end) of one sequence: token ids, starts, slots and its block table up to
        `end`, at least 2 pages wide (padded with the scratch page, which the chunk's causal mask hides: its slots
        are past every position of the chunk), each with a leading row dimension of 1. A width of 1 would be a graph
        of its own (dynamo and torch.export specialise a size of 1), run only by chunks within a prompt's first page,
        and so one more graph to compile, warm up and check."""
        cache, start = self.cache, seq.length
        pages = max(2, cache.pages_for(end))
        ids = torch.tensor([seq.request.prompt_ids[start:end]])
        slots = cache.slots(seq.seq_id, start, end)[None]
        table = torch.tensor([cache.block_row(seq.seq_id)[:pages]])
        return ids, torch.tensor([start]), slots, table

    def prepare_decode(self, seqs: list[Sequence]) -> tuple[torch.Tensor, ...]:
        """One token per row, padded to the decode bucket: token ids, positions, slots [batch], block table
        [batch, pages] (`_decode_pages`), context mask [1, batch, 1, pages * page_size]. Padded rows: token 0 at
        position 0 of the scratch page, seeing that one slot."""
        cache = self.cache
        batch = next(b for b in self.buckets if b >= len(seqs)) if self.pad_batch else len(seqs)
        pad = batch - len(seqs)
        for s in seqs:
            cache.extend(s.seq_id, s.length + 1)  # the last sampled token is written at position s.length
        width = self._decode_pages(seqs)
        tokens = torch.tensor([s.completion.output_ids[-1] for s in seqs] + [0] * pad)
        positions = torch.tensor([s.length for s in seqs] + [0] * pad)
        table = torch.tensor([cache.block_row(s.seq_id)[:width] for s in seqs] + [[0] * width] * pad)
        page = table.gather(1, (positions // cache.page_size)[:, None])[:, 0]
        slots = page * cache.page_size + positions % cache.page_size
        context = width * cache.page_size
        mask = (torch.arange(context) < (positions + 1)[:, None]).view(1, batch, 1, context)
        return tokens, positions, slots, table, mask

    def _decode_pages(self, seqs: list[Sequence]) -> int:
        """Block-table width of a decode step of `seqs` (each about to write position `length`). With
        `dynamic_context` (CPU serving): the pages its longest row uses, so that attention reads a 200-token batch's
        pages rather than a 512-token context's (docs/measurements.md, "A decode step reads only its rows' pages"),
        one graph per batch bucket taking every width (the model marks it dynamic), and at least 2 pages: dynamo
        specialises a size of 1, and a width of 1 would be another graph, compiled on a user's request. Otherwise
        the whole context, every step: one static graph, as trials measure it, and as captured graphs (CUDA graphs,
        aclgraph) want, one recording per shape."""
        full = self.cache.pages_per_seq
        if not self.dynamic_context:
            return full
        return min(full, max(2, self.cache.pages_for(max(s.length for s in seqs) + 1)))

    def prepare_sample(self, seqs: list[Sequence]) -> SamplingBatch:
        """Each row's sampling settings; a forced row is greedy (its choice is what the gate compares)."""
        temperatures, top_ps, generators, banned = [], [], [], []
        for s in seqs:
            req = s.request
            temperatures.append(0.0 if req.forced_ids else req.sampling.temperature)
            top_ps.append(req.sampling.top_p)
            generators.append(s.generator)
            banned.append(req.eos_token_id if len(s.completion.output_ids) < req.min_new_tokens else None)
        return SamplingBatch(temperatures, top_ps, generators, banned)

    # -- forwards -------------------------------------------------------------------------------------------------
    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        chosen = self.sampler(logits, self.prepare_sample(seqs))
        now = time.perf_counter()
        for s, token in zip(seqs, chosen):
            s.append(token, now)

    def _prefill(self, batch: PrefillBatch) -> None:
        if batch.end is None:
            for group in length_groups(batch.seqs):
                logits = self.model.prefill(*self.prepare_prefill(group))
                for s in group:
                    s.length = s.prompt_len
                self._sample(logits, group)
            return
        seq = batch.seqs[0]
        logits = self.model.prefill_chunk(*self.prepare_prefill_chunk(seq, batch.end))
        seq.length = batch.end
        if batch.end == seq.prompt_len:  # the prompt's last chunk: its first token
            self._sample(logits, [seq])

    def _decode(self, seqs: list[Sequence]) -> None:
        logits = self.model.decode(*self.prepare_decode(seqs), dynamic_context=self.dynamic_context)
        for s in seqs:
            s.length += 1
        self._sample(logits, seqs)

    # -- driving --------------------------------------------------------------------------------------------------
    def run(self, requests: list[Request]) -> list[Completion]:
        """All requests arrive now; returns their completions in request order. Drives the step-wise API, so
        that offline runs and serving batch alike; call it on an idle runner."""
        now = time.perf_counter()
        completions = [self.submit(r, arrival=now) for r in requests]
        self._drain()
        return completions

    def _drain(self) -> None:
        """Step until every submitted request has finished."""
        while self.scheduler.has_work:
            self.step()

    def warm_up(self, prompt_tokens: int = 16) -> None:
        """Run what a compiled engine compiles a graph for, so that it compiles here rather than on a user's request:
        each decode bucket, after a prefill of as many prompts (token ids of no meaning; one prompt and several
        are different graphs, so a lone prompt first where a lone row is padded to a bucket of more), and with
        `prefill_chunk` a prompt longer than it (a first chunk, then a later one)."""
        room = self.cache.max_seq_len - 2  # each warm-up request writes its prompt and two tokens
        buckets = self.buckets if self.pad_batch else (self.max_batch,)
        for rows in ((1,) if self._lone_padded else ()) + buckets:
            # Prompt lengths differ from one bucket to the next: prefill meets both of its dynamic dimensions.
            length = max(1, min(prompt_tokens + rows, room))
            self.run([Request([1] * length, 2, min_new_tokens=2) for _ in range(rows)])
        if self.prefill_chunk is not None and room > self.prefill_chunk + 2:
            # Chunks are taken only while another sequence decodes: one does, through the long prompt's two chunks.
            self.submit(Request([1] * prompt_tokens, 6, min_new_tokens=6))
            self.step()
            self.submit(Request([1] * min(self.prefill_chunk + prompt_tokens + 1, room), 2, min_new_tokens=2))
            self._drain()

    def _admitted(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            seq.generator = self.sampler.generator(seq.request.sampling)
