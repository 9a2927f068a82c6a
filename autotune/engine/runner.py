"""Continuous batching: admit requests up to the batch size, prefill them together, decode all running rows together."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from autotune.engine.kv_cache import OutOfPages, PagedKVCache
from autotune.engine.model import EngineModel

__all__ = ["Request", "Completion", "Runner", "Sampling"]


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


class Runner:
    """Runs requests through an EngineModel with a paged cache, `max_batch` sequences at a time.

    `pad_batch` keeps every decode step at `max_batch` rows (static shapes for compiled graphs); padded rows
    write to the cache's scratch page and are ignored."""

    def __init__(self, model: EngineModel, cache: PagedKVCache, max_batch: int, pad_batch: bool = False) -> None:
        self.model, self.cache, self.max_batch, self.pad_batch = model, cache, max_batch, pad_batch
        model.attach(cache)
        self._next_id = 0
        # State of the step-wise API (submit/step), used by serving; run() keeps its own queue.
        self._waiting: deque[Completion] = deque()
        self._running: list[_Running] = []

    def _admit(self, completions: list[Completion]) -> list[_Running]:
        """Prefill several prompts in one forward: [seqs, longest prompt], right-padded."""
        cache = self.cache
        width = max(len(c.request.prompt_ids) for c in completions)
        ids = torch.zeros(len(completions), width, dtype=torch.long)
        slots = torch.zeros(len(completions), width, dtype=torch.long)  # pads write to the scratch page
        lengths = torch.empty(len(completions), dtype=torch.long)
        admitted = []
        for i, completion in enumerate(completions):
            req = completion.request
            seq_id, self._next_id = self._next_id, self._next_id + 1
            n = len(req.prompt_ids)
            cache.allocate(seq_id, n, n + req.max_new_tokens)
            ids[i, :n] = torch.tensor(req.prompt_ids)
            slots[i, :n] = cache.slots(seq_id, 0, n)
            lengths[i] = n
            gen = None
            if req.sampling.temperature > 0:
                # On the logits' device: multinomial draws there (CPU, CUDA or NPU).
                gen = torch.Generator(device=self.model.lm_head.weight.device)
                gen.manual_seed(req.sampling.seed if req.sampling.seed is not None else seq_id)
            admitted.append(_Running(seq_id, completion, n, gen))
        logits = self.model.prefill(ids, slots, lengths)
        for running, token in zip(admitted, _next_tokens(logits, admitted)):
            self._append(running, token)
        return admitted

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
        batch = self.max_batch if self.pad_batch else len(rows)
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

    def run(self, requests: list[Request]) -> list[Completion]:
        """All requests arrive now; returns their completions in request order."""
        now = time.perf_counter()
        completions = [Completion(r, arrival=now) for r in requests]
        waiting = deque(completions)
        running: list[_Running] = []
        while waiting or running:
            for r in running:
                if r.completion.finish_reason:
                    self.cache.free(r.seq_id)
            running = [r for r in running if not r.completion.finish_reason]
            batch = self._admissible(waiting, len(running))
            if batch:
                running.extend(self._admit(batch))
            running_now = [r for r in running if not r.completion.finish_reason]
            if running_now:
                self._decode_step(running_now)
        return completions

    def _admissible(self, queue: deque[Completion], running: int) -> list[Completion]:
        """Take from the queue what fits now: free batch rows and (pool policy) the pages each request reserves,
        counting what the earlier ones of this batch take."""
        batch: list[Completion] = []
        pages = 0
        while queue and running + len(batch) < self.max_batch:
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
        return len(self._running)

    def step(self) -> list[Completion]:
        """Admit waiting requests up to `max_batch` (prefill), then one decode step of every running sequence.
        Returns the completions that finished (or were cancelled) during this step; their pages are freed."""
        finished = [r.completion for r in self._running if r.completion.finish_reason]
        self._release()
        batch: list[Completion] = []
        for completion in self._admissible(self._waiting, len(self._running)):
            (finished if completion.finish_reason else batch).append(completion)
        if batch:
            self._running.extend(self._admit(batch))
        rows = [r for r in self._running if not r.completion.finish_reason]
        if rows:
            self._decode_step(rows)
        finished += [r.completion for r in self._running if r.completion.finish_reason]
        self._release()
        return finished

    def _release(self) -> None:
        for r in self._running:
            if r.completion.finish_reason:
                self.cache.free(r.seq_id)
        self._running = [r for r in self._running if not r.completion.finish_reason]
