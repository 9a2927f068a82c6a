"""Continuous batching: admit requests up to the batch size, prefill them (together, or a long prompt a chunk at a
time), decode all running rows together."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from autotune.engine.kv_cache import OutOfPages, PagedKVCache
from autotune.engine.model import EngineModel

__all__ = ["Request", "Completion", "Runner", "Sampling", "batch_buckets"]


@dataclass(frozen=True, slots=True)
class Sampling:
    """Greedy when temperature is 0."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass(slots=True)
class Request:
    prompt_ids: list[int]
    max_new_tokens: int
    min_new_tokens: int = 0
    eos_token_id: int | None = None
    sampling: Sampling = field(default_factory=Sampling)
    stop_ids: tuple[int, ...] = ()
    # Teacher forcing through the decode path (the accuracy gate): the emitted tokens are these, and the model's
    # own greedy choice at each step is recorded in Completion.greedy_ids.
    forced_ids: tuple[int, ...] = ()


@dataclass(slots=True)
class Completion:
    request: Request
    output_ids: list[int] = field(default_factory=list)
    arrival: float = 0.0
    token_times: list[float] = field(default_factory=list)
    finish_reason: str = ""
    greedy_ids: list[int] = field(default_factory=list)  # with forced_ids only

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival

    @property
    def tpot(self) -> float | None:
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else None


class _Running:
    __slots__ = ("seq_id", "completion", "length", "generator")

    def __init__(self, seq_id: int, completion: Completion, length: int, generator: torch.Generator | None) -> None:
        self.seq_id, self.completion, self.length, self.generator = seq_id, completion, length, generator


def _sample(probs: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    # probs: [vocab]
    if sampling.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < sampling.top_p
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.inference_mode()  # logits are inference tensors: masking them in place needs the same mode
def _next_tokens(logits: torch.Tensor, rows: list[_Running]) -> list[int]:
    """One token per row; logits: [rows (or more: padding), vocab] in fp32, modified in place."""
    for i, r in enumerate(rows):
        req = r.completion.request
        if len(r.completion.output_ids) < req.min_new_tokens and req.eos_token_id is not None:
            # As transformers' min_new_tokens does: end-of-sequence cannot be chosen before the minimum.
            logits[i, req.eos_token_id] = float("-inf")
    greedy = logits[:len(rows)].argmax(-1).tolist()  # one call for the batch: most requests are greedy
    out = []
    for i, r in enumerate(rows):
        sampling = r.completion.request.sampling
        forced = r.completion.request.forced_ids
        if forced:
            r.completion.greedy_ids.append(greedy[i])
            out.append(forced[len(r.completion.output_ids)])
        elif sampling.temperature <= 0:
            out.append(greedy[i])
        else:
            out.append(_sample(torch.softmax(logits[i] / sampling.temperature, dim=-1), sampling, r.generator))
    return out


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Row counts a padded decode step runs at: the powers of two below `max_batch`, then `max_batch`. A compiled
    engine keeps one graph per bucket, so that one running request pays for one row, not for `max_batch`."""
    sizes, n = [], 1
    while n < max_batch:
        sizes.append(n)
        n *= 2
    return (*sizes, max_batch)


class Runner:
    """Runs requests through an EngineModel with a paged cache, `max_batch` sequences at a time.

    `pad_batch` pads every decode step to the smallest of `batch_buckets(max_batch)` that holds its rows (static
    shapes for compiled graphs, a few of them); padded rows write to the cache's scratch page and are ignored.
    `bucketed` False: one bucket, `max_batch`.
    `prefill_chunk` bounds the prompt tokens one step prefills (padding counted) while other sequences decode, so
    that new prompts delay the running decodes by one bounded forward a step: fresh prompts that fit are prefilled
    together, a longer one a chunk per step, attending to its earlier chunks in the cache. None, or no sequence
    decoding: every admitted prompt at once (a burst of arrivals is prefilled as the offline benchmark does)."""

    def __init__(self, model: EngineModel, cache: PagedKVCache, max_batch: int, pad_batch: bool = False,
                 prefill_chunk: int | None = None, bucketed: bool = False) -> None:
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be a positive number of tokens, not {prefill_chunk}")
        self.model, self.cache, self.max_batch, self.pad_batch = model, cache, max_batch, pad_batch
        self.prefill_chunk = prefill_chunk
        # Offline (benchmark, gate) one bucket: the batch stays full but for its tail, and every extra graph is
        # compile time inside a trial (and under O2 a frozen copy of the weights); serving, where few requests
        # often run, pays that once at start-up.
        self.buckets = batch_buckets(max_batch) if bucketed else (max_batch,)
        model.attach(cache)
        self._next_id = 0
        self._waiting: deque[Completion] = deque()
        self._prefilling: list[_Running] = []  # admitted, pages held, prompt not all in the cache yet
        self._running: list[_Running] = []  # decoding
        # The most sequences admitted at once since it was last reset: below max_batch where the pool policy's
        # pages ran out first, so that a figure is read at the concurrency that really ran.
        self.peak_running = 0

    # -- prefill --------------------------------------------------------------------------------------------------
    def _start(self, completion: Completion) -> _Running:
        """A batch row for an admitted request: its pages (the whole prompt's) and, when sampling, its generator."""
        req = completion.request
        seq_id, self._next_id = self._next_id, self._next_id + 1
        n = len(req.prompt_ids)
        self.cache.allocate(seq_id, n, n + req.max_new_tokens)
        gen = None
        if req.sampling.temperature > 0:
            # On the logits' device: multinomial draws there (CPU, CUDA or NPU).
            gen = torch.Generator(device=self.model.lm_head.weight.device)
            gen.manual_seed(req.sampling.seed if req.sampling.seed is not None else seq_id)
        return _Running(seq_id, completion, 0, gen)

    def _prefill_whole(self, rows: list[_Running]) -> None:
        """Whole prompts from position 0 in one forward: [rows, longest prompt], right-padded."""
        cache = self.cache
        width = max(len(r.completion.request.prompt_ids) for r in rows)
        if self.pad_batch:
            width = max(width, 2)  # dynamo specialises a length of 1: one more graph, compiled on a user's request
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        slots = torch.zeros(len(rows), width, dtype=torch.long)  # pads write to the scratch page
        lengths = torch.empty(len(rows), dtype=torch.long)
        for i, r in enumerate(rows):
            prompt = r.completion.request.prompt_ids
            n = len(prompt)
            ids[i, :n] = torch.tensor(prompt)
            slots[i, :n] = cache.slots(r.seq_id, 0, n)
            lengths[i] = r.length = n
        logits = self.model.prefill(ids, slots, lengths)
        for r, token in zip(rows, _next_tokens(logits, rows)):
            self._append(r, token)

    def _prefill_part(self, row: _Running, end: int) -> bool:
        """Prompt positions [row.length, end) of one sequence, attending to what the cache holds before them.
        True when that was the prompt's last chunk (its first token is sampled)."""
        cache, prompt = self.cache, row.completion.request.prompt_ids
        start = row.length
        pages = -(-end // cache.page_size)
        ids = torch.tensor([prompt[start:end]])
        slots = cache.slots(row.seq_id, start, end)[None]
        table = torch.tensor([cache.block_row(row.seq_id)[:pages]])
        logits = self.model.prefill_chunk(ids, torch.tensor([start]), slots, table)
        row.length = end
        if end < len(prompt):
            return False
        self._append(row, _next_tokens(logits, [row])[0])
        return True

    def _prefill(self) -> None:
        """One prefill forward: the fresh prompts at the head of the queue that fit the chunk together, else the
        next chunk of the head's prompt. Rows whose prompt is all in the cache move on to decoding. While no row
        decodes there is no one to keep waiting: every admitted prompt (the rest of a chunked one) at once."""
        budget, head = self.prefill_chunk if self._running else None, self._prefilling[0]
        if head.length == 0 and (budget is None or len(head.completion.request.prompt_ids) <= budget):
            group, width = [], 0
            for r in self._prefilling:
                n = len(r.completion.request.prompt_ids)
                if r.length or (budget is not None and (len(group) + 1) * max(width, n) > budget):
                    break
                group.append(r)
                width = max(width, n)
            self._prefill_whole(group)
            done = group
        else:
            n = len(head.completion.request.prompt_ids)
            end = n if budget is None else min(n, head.length + budget)
            if n - end == 1 and end - head.length > 2:
                end -= 1  # no last chunk of one token: a length of 1 is a graph of its own (_prefill_whole)
            done = [head] if self._prefill_part(head, end) else []
        self._prefilling = self._prefilling[len(done):]
        self._running.extend(done)

    # -- decode ---------------------------------------------------------------------------------------------------
    def _append(self, running: _Running, token: int) -> None:
        c = running.completion
        c.output_ids.append(token)
        c.token_times.append(time.perf_counter())
        req = c.request
        produced = len(c.output_ids)
        if produced >= req.max_new_tokens:
            c.finish_reason = "length"
        elif produced >= req.min_new_tokens and (token == req.eos_token_id or token in req.stop_ids):
            c.finish_reason = "stop"

    def _decode_step(self, rows: list[_Running]) -> None:
        cache = self.cache
        batch = next(b for b in self.buckets if b >= len(rows)) if self.pad_batch else len(rows)
        tokens = torch.zeros(batch, dtype=torch.long)
        positions = torch.zeros(batch, dtype=torch.long)
        slots = torch.zeros(batch, dtype=torch.long)
        table = torch.zeros(batch, cache.pages_per_seq, dtype=torch.long)
        lengths = torch.ones(batch, dtype=torch.long)
        for i, r in enumerate(rows):
            pos = r.length  # the last sampled token is written at this position
            cache.extend(r.seq_id, pos + 1)
            tokens[i] = r.completion.output_ids[-1]
            positions[i] = pos
            table[i] = torch.tensor(cache.block_row(r.seq_id))
            slots[i] = int(table[i, pos // cache.page_size]) * cache.page_size + pos % cache.page_size
            lengths[i] = pos + 1
        context = cache.pages_per_seq * cache.page_size
        mask = (torch.arange(context) < lengths[:, None]).view(1, batch, 1, context)
        logits = self.model.decode(tokens, positions, slots, table, mask)
        for r, token in zip(rows, _next_tokens(logits, rows)):
            r.length += 1
            self._append(r, token)

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
        while self._waiting or self._prefilling or self._running:
            self.step()

    def warm_up(self, prompt_tokens: int = 16) -> None:
        """Run what a compiled engine compiles a graph for, so that it compiles here rather than on a user's request:
        each decode bucket, after a prefill of as many prompts (token ids of no meaning; one prompt and several
        are different graphs), and with `prefill_chunk` a prompt longer than it (a first chunk, then a later one)."""
        room = self.cache.max_seq_len - 2  # each warm-up request writes its prompt and two tokens
        for rows in self.buckets if self.pad_batch else (self.max_batch,):
            # Prompt lengths differ from one bucket to the next: prefill meets both of its dynamic dimensions.
            length = max(1, min(prompt_tokens + rows, room))
            self.run([Request([1] * length, 2, min_new_tokens=2) for _ in range(rows)])
        if self.prefill_chunk is not None and room > self.prefill_chunk + 2:
            # Chunks are taken only while another sequence decodes: one does, through the long prompt's two chunks.
            self.submit(Request([1] * prompt_tokens, 6, min_new_tokens=6))
            self.step()
            self.submit(Request([1] * min(self.prefill_chunk + prompt_tokens + 1, room), 2, min_new_tokens=2))
            self._drain()

    def _admissible(self, queue: deque[Completion], rows: int) -> list[Completion]:
        """Take from the queue what fits now: free batch rows and (pool policy) the pages each request reserves,
        counting what the earlier ones of this batch take."""
        batch: list[Completion] = []
        pages = 0
        while queue and rows + len(batch) < self.max_batch:
            req = queue[0].request
            need = self.cache.pages_to_admit(len(req.prompt_ids) + req.max_new_tokens)
            if pages + need > self.cache.free_pages:
                if need > self.cache.usable_pages:
                    raise OutOfPages(f"a request of up to {len(req.prompt_ids) + req.max_new_tokens} tokens needs "
                                     f"{need} pages; the pool holds {self.cache.usable_pages}")
                break
            pages += need
            batch.append(queue.popleft())
        return batch

    # Step-wise API for serving: requests join while others run; the caller drives step() from one thread.
    def submit(self, request: Request, arrival: float | None = None) -> Completion:
        """Queue a request; its Completion fills in as step() runs. Set `finish_reason` on it to cancel it."""
        completion = Completion(request, arrival=time.perf_counter() if arrival is None else arrival)
        self._waiting.append(completion)
        return completion

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._prefilling) + len(self._running)

    def step(self) -> list[Completion]:
        """Admit waiting requests up to `max_batch`, one prefill forward (all admitted prompts, or what
        `prefill_chunk` allows), then one decode step of every running sequence. Returns the completions that
        finished (or were cancelled) during this step; their pages are freed."""
        finished = self._release()
        for completion in self._admissible(self._waiting, len(self._prefilling) + len(self._running)):
            if completion.finish_reason:
                finished.append(completion)
            else:
                self._prefilling.append(self._start(completion))
        self.peak_running = max(self.peak_running, self.num_running)
        if self._prefilling:
            self._prefill()
        rows = [r for r in self._running if not r.completion.finish_reason]
        if rows:
            self._decode_step(rows)
        return finished + self._release()

    def _release(self) -> list[Completion]:
        """Free the pages of finished or cancelled sequences; returns their completions."""
        done = [r for r in (*self._prefilling, *self._running) if r.completion.finish_reason]
        for r in done:
            self.cache.free(r.seq_id)
        self._prefilling = [r for r in self._prefilling if not r.completion.finish_reason]
        self._running = [r for r in self._running if not r.completion.finish_reason]
        return [r.completion for r in done]
