"""The step-wise API of a runner over the serving scheduler (engine/scheduler.py), which engine/peer.StepRunner names:
requests join while others run, and the caller drives step() from one thread. What a step's forwards are is the
subclass's: autotune's engine runs the model (engine/runner.py), the simulator advances a virtual clock by their
predicted time (sim/served.py)."""
from __future__ import annotations

import time

from autotune.engine.scheduler import PrefillBatch, Scheduler
from autotune.engine.sequence import Completion, Request, Sequence

__all__ = ["SteppedRunner"]


class SteppedRunner:
    scheduler: Scheduler

    def _now(self) -> float:
        return time.perf_counter()

    def _admitted(self, seqs: list[Sequence]) -> None:
        """Sequences the scheduler just admitted, before their prefill."""

    def _prefill(self, batch: PrefillBatch) -> None:
        raise NotImplementedError

    def _decode(self, seqs: list[Sequence]) -> None:
        raise NotImplementedError

    def submit(self, request: Request, arrival: float | None = None) -> Completion:
        """Queue a request; its Completion fills in as step() runs. Set `finish_reason` on it to cancel it."""
        completion = Completion(request, arrival=self._now() if arrival is None else arrival)
        self.scheduler.add(completion)
        return completion

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return self.scheduler.num_admitted

    def kv_usage(self) -> tuple[int, int]:
        """(pages held by sequences, pages of the cache less the null page)."""
        cache = self.scheduler.cache
        return cache.pages_in_use, cache.num_pages - 1

    def step(self) -> list[Completion]:
        """Admit waiting requests up to `max_batch`, one prefill forward (all admitted prompts, or what
        `prefill_chunk` allows), then one decode step of every running sequence. Returns the completions that
        finished (or were cancelled) during this step; their pages are freed."""
        scheduler = self.scheduler
        finished = scheduler.release()
        admitted, cancelled = scheduler.admit()
        self._admitted(admitted)
        if (batch := scheduler.schedule_prefill()) is not None:
            self._prefill(batch)
            scheduler.prefilled()
        if rows := scheduler.decoding():
            self._decode(rows)
        return finished + cancelled + scheduler.release()
