"""Admission and prefill grouping: which waiting requests get batch rows and KV pages, which prompts the next
prefill forward takes (whole prompts together, or a chunk of a long one), and freeing what finished sequences held."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from autotune.engine.kv_cache import OutOfPages, PagedKVCache
from autotune.engine.sequence import Completion, Sequence

__all__ = ["Scheduler", "PrefillBatch", "length_groups"]

# A whole-prompts prefill forward computes every prompt at its group's longest length; on the benchmark's 16 prompts
# of 112-144 tokens one group pads 2,062 tokens to 2,304 (12%), a share of the prefill time that OpenVINO's packed
# chunks do not spend (docs/measurements.md, "Where the time goes, step by step"). Prompts sorted by length are split
# into the forwards of least padding, where one more forward is worth FORWARD_SHARE of all the prompts' tokens (a
# forward's fixed cost: weights read once more, a smaller matmul), and at least MIN_FORWARD_TOKENS (short prompts
# are not worth splitting): on those 16 prompts, 3 forwards padding 3%. A group keeps at least two prompts: one
# prompt is a graph of its own (dynamo specialises a size of 1), compiled on a user's request.
FORWARD_SHARE = 1 / 64
MIN_FORWARD_TOKENS = 32


@dataclass(frozen=True, slots=True)
class PrefillBatch:
    """One prefill forward: whole prompts from position 0 (`end` None), or positions [length, end) of one sequence's
    prompt (`seqs` holds it alone)."""

    seqs: list[Sequence]
    end: int | None = None


def length_groups(seqs: list[Sequence]) -> list[list[Sequence]]:
    """Whole prompts split into prefill forwards of similar lengths (FORWARD_SHARE): the sorted prompts, cut where
    the padded tokens plus each forward's worth are least, no group of one prompt (unless there is one)."""
    ordered = sorted(seqs, key=lambda s: s.prompt_len)
    n = len(ordered)
    if n < 4:  # two groups of two at least
        return [ordered] if ordered else []
    worth = max(FORWARD_SHARE * sum(s.prompt_len for s in ordered), MIN_FORWARD_TOKENS)
    # best[i]: the least cost of the first i prompts; cut[i]: where its last group starts.
    best, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for i in range(2, n + 1):
        for j in range(0, i - 1):  # group ordered[j:i], of two prompts at least
            if j == 1:
                continue  # it would leave a group of one before it
            cost = best[j] + (i - j) * ordered[i - 1].prompt_len + worth
            if cost < best[i]:
                best[i], cut[i] = cost, j
    groups, i = [], n
    while i:
        groups.append(ordered[cut[i]:i])
        i = cut[i]
    return groups[::-1]


class Scheduler:
    """Waiting requests, then sequences prefilling (admitted, pages held, prompt not all in the cache yet), then
    sequences decoding; at most `max_batch` admitted at once.

    `prefill_chunk` bounds the prompt tokens one prefill forward takes (padding counted) while other sequences
    decode: fresh prompts that fit are prefilled together, a longer one a chunk per step. None, or no sequence
    decoding: every admitted prompt at once (a burst of arrivals is prefilled as the offline benchmark does)."""

    def __init__(self, cache: PagedKVCache, max_batch: int, prefill_chunk: int | None = None) -> None:
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be a positive number of tokens, not {prefill_chunk}")
        self.cache, self.max_batch, self.prefill_chunk = cache, max_batch, prefill_chunk
        self.waiting: deque[Completion] = deque()
        self.prefilling: list[Sequence] = []
        self.running: list[Sequence] = []
        # The most sequences admitted at once since it was last reset: below max_batch where the pool policy's
        # pages ran out first, so that a figure is read at the concurrency that really ran.
        self.peak_running = 0
        self._next_id = 0

    def add(self, completion: Completion) -> None:
        self.waiting.append(completion)

    @property
    def num_admitted(self) -> int:
        return len(self.prefilling) + len(self.running)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    def admit(self) -> tuple[list[Sequence], list[Completion]]:
        """Take from the queue what fits now: free batch rows and (pool policy) the pages each request reserves,
        allocated here. Returns the new sequences (now prefilling) and the requests cancelled while they waited."""
        admitted: list[Sequence] = []
        cancelled: list[Completion] = []
        cache = self.cache
        while self.waiting and self.num_admitted < self.max_batch:
            completion = self.waiting[0]
            if completion.finish_reason:  # cancelled before it ran: it takes neither a row nor pages
                cancelled.append(self.waiting.popleft())
                continue
            req = completion.request
            n = len(req.prompt_ids)
            need = cache.pages_to_admit(n + req.max_new_tokens)
            if need > cache.free_pages:
                if need > cache.usable_pages:
                    raise OutOfPages(f"a request of up to {n + req.max_new_tokens} tokens needs {need} pages; the "
                                     f"pool holds {cache.usable_pages}")
                break  # it waits for a running sequence to free its pages
            self.waiting.popleft()
            seq = Sequence(self._next_id, completion)
            self._next_id += 1
            cache.allocate(seq.seq_id, n, n + req.max_new_tokens)  # the whole prompt's pages (pool: all of them)
            self.prefilling.append(seq)
            admitted.append(seq)
        self.peak_running = max(self.peak_running, self.num_admitted)
        return admitted, cancelled

    def schedule_prefill(self) -> PrefillBatch | None:
        """The next prefill forward: the fresh prompts at the head of the prefilling ones that fit the chunk
        together, else the next chunk of the head's prompt. While no sequence decodes there is no one to keep
        waiting: every admitted prompt (the rest of a chunked one) at once."""
        if not self.prefilling:
            return None
        budget, head = self.prefill_chunk if self.running else None, self.prefilling[0]
        if head.length == 0 and (budget is None or head.prompt_len <= budget):
            group: list[Sequence] = []
            width = 0
            for seq in self.prefilling:
                n = seq.prompt_len
                if seq.length or (budget is not None and (len(group) + 1) * max(width, n) > budget):
                    break
                group.append(seq)
                width = max(width, n)
            return PrefillBatch(group)
        n = head.prompt_len
        end = n if budget is None else min(n, head.length + budget)
        if n - end == 1 and end - head.length > 2:
            end -= 1  # no last chunk of one token: a length of 1 is a graph of its own (a whole-prompt prefill's)
        return PrefillBatch([head], end)

    def prefilled(self) -> None:
        """Sequences whose prompt is all in the cache (their first token sampled) move on to decoding."""
        done = [s for s in self.prefilling if s.length == s.prompt_len]
        if done:
            self.prefilling = [s for s in self.prefilling if s.length < s.prompt_len]
            self.running.extend(done)

    def decoding(self) -> list[Sequence]:
        """The rows of the next decode step: every running sequence not finished (or cancelled) yet."""
        return [s for s in self.running if not s.finished]

    def release(self) -> list[Completion]:
        """Free the pages of finished or cancelled sequences; returns their completions."""
        done = [s for s in (*self.prefilling, *self.running) if s.finished]
        if not done:
            return []
        for s in done:
            self.cache.free(s.seq_id)
        self.prefilling = [s for s in self.prefilling if not s.finished]
        self.running = [s for s in self.running if not s.finished]
        return [s.completion for s in done]
