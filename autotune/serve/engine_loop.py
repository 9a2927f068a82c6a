"""The engine loop (vLLM's EngineCore role): one thread drives a step runner (engine/peer.py StepRunner: autotune's
engine runner, or OpenVINO's pipeline) step by step; the HTTP server's event loop submits requests and is handed
their tokens.

The Runner is not thread-safe and never needs to be: only the engine thread touches it. Other threads talk to
it through a bounded inbox; each request's events go back through the callback it was submitted with (the HTTP
layer puts them on an asyncio queue of its event loop), and gauges are snapshots the engine thread publishes.

On the CPU the engine thread should be the thread that built the engine (`autotune serve` runs the loop on its
main thread, `run()`): torch's OpenMP runtime (libgomp) keeps a pool of workers per thread that ever ran a
parallel region, and once it manages more workers than there are CPUs its idle workers stop spinning and sleep,
so every one of the thousands of parallel regions of a decode step waits for a wake-up (scripts/omp_threads.py
times one matmul both ways; docs/measurements.md, "Before: the hand-written server", has what it cost a served
token). `start()` runs the loop on a thread of its own, for a process whose main
thread is busy elsewhere (tests, embedding), at that cost."""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from autotune.engine import Completion, Engine, Request
from autotune.engine.peer import StepRunner
from autotune.engine.serving import PREFILL_CHUNK, serving_runner
from autotune.progress import log

__all__ = ["EngineLoop", "Event", "Handle", "Overloaded", "ServingStopped", "PREFILL_CHUNK", "serving_runner"]

# A burst of requests that finds the engine idle (clients connecting together) is admitted as one: the loop keeps
# taking arrivals while each comes within ARRIVAL_GAP_S of the last, for at most BURST_WINDOW_S, so that the burst is
# prefilled in one forward as offline, rather than its first request alone and the rest in chunks beside that
# request's decode (one served run of 16 streaming requests took 72 engine steps where offline takes 64). It costs a
# lone request on an idle server one gap of waiting.
ARRIVAL_GAP_S = 0.005
BURST_WINDOW_S = 0.05


class Overloaded(Exception):
    """The bounded queue is full: the client should retry later (HTTP 503)."""


class ServingStopped(Exception):
    """The server is shutting down."""


# ("tokens", [ids]) any number of times, then ("done", finish_reason) or ("error", message).
Event = tuple[str, object]


@dataclass(slots=True)
class Handle:
    """One request in flight. `deliver` is called with each of its events, in order: on the engine thread, or,
    where the request came with `post` (an event loop's call_soon_threadsafe), on the thread `post` runs it on, all
    the step's events of that `post` in one call."""

    request: Request
    arrival: float
    deliver: Callable[[Event], None]
    post: Callable[..., object] | None = None
    completion: Completion | None = None
    cancel_reason: str | None = None
    sent: int = 0
    admitted_at: float | None = None

    def cancel(self, reason: str = "stop") -> None:
        """Ask the engine thread to end this request at its next step (a stop string was seen, or the client left)."""
        self.cancel_reason = reason


class EngineLoop:
    """Dynamic batching: requests join the running batch as soon as a row (and KV pages) are free, up to the
    recipe's batch size; at most `max_queue` more wait. Beyond that, submit() raises Overloaded."""

    def __init__(self, engine: Engine, max_seq_len: int, max_queue: int,
                 prefill_chunk: int | None = None) -> None:
        """`prefill_chunk`: the configuration's own (engine/serving.py) unless given."""
        self.engine, self.max_seq_len, self.max_queue = engine, max_seq_len, max_queue
        self.prefill_chunk = prefill_chunk
        self._runner = self._new_runner()
        self._warm = False
        self._inbox: queue.Queue[Handle] = queue.Queue()
        self._live: list[Handle] = []
        self._in_system = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._warm_up_error: Exception | None = None
        self._thread: threading.Thread | None = None
        self.gauges = {"queue_depth": 0, "running": 0, "kv_pages_in_use": 0, "kv_pages_total": 0}
        self.steps = 0
        self.busy_s = 0.0  # wall time inside engine steps: with the wall clock, how much of it the engine worked

    def _new_runner(self) -> StepRunner:
        return serving_runner(self.engine, self.max_seq_len, self.prefill_chunk)

    @property
    def batch_size(self) -> int:
        return self._runner.max_batch

    def warm_up(self) -> None:
        """Compile, on the calling thread, what serving will meet (every decode bucket, each prefill path); once:
        a packaged build's first-start check warms this loop's runner to learn which graphs it serves
        (serve/first_start.py), and the start's own warm-up then has nothing left to do."""
        if not self._warm:
            self._runner.warm_up()
            self._warm = True

    def run(self) -> None:
        """The serving loop on the calling thread (which built and warmed up the engine) until stop() or an
        exception (Ctrl-C); requests still in flight then end with an error event."""
        try:
            self._loop()
        finally:
            self._stop.set()
            self._fail_all("the server is shutting down")

    def start(self) -> None:
        """Warm up and serve on a thread of its own; returns once warm. Slower on the CPU than run() on the
        building thread (module docstring): for processes whose main thread does something else."""
        self._thread = threading.Thread(target=self._background, name="autotune-engine", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._warm_up_error is not None:
            raise self._warm_up_error

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def submit(self, request: Request, deliver: Callable[[Event], None],
               post: Callable[..., object] | None = None) -> Handle:
        """Queue `request`; its events go to `deliver`, called on the engine thread (it must not block), or through
        `post` (Handle).

        `post` is for an asyncio loop's requests: one wake-up of its thread per engine step for all of them, not
        one per request. On a machine whose cores all run the step's OpenMP workers, each wake-up of another thread
        preempts a worker in the middle of a parallel region and the whole step waits for it."""
        if self._stop.is_set():
            raise ServingStopped("the server is shutting down")
        with self._lock:
            if self._in_system >= self.batch_size + self.max_queue:
                raise Overloaded(f"{self._in_system} requests in flight (batch {self.batch_size} + queue "
                                 f"{self.max_queue}): retry later")
            self._in_system += 1
        handle = Handle(request, time.perf_counter(), deliver, post)
        self._inbox.put(handle)
        return handle

    def _background(self) -> None:
        self.engine.enter_thread()  # compile settings are per thread: this one compiles and runs the graphs
        try:
            self.warm_up()
        except Exception as exc:  # noqa: BLE001 - handed to start(), which raises it
            self._warm_up_error = exc
            return
        finally:
            self._ready.set()
        self.run()

    def _loop(self) -> None:
        while not self._stop.is_set():
            idle = not self._live
            try:
                # Block only when nothing runs: a running batch must not wait for new arrivals.
                handle = self._inbox.get(timeout=0.2) if idle else self._inbox.get_nowait()
                burst_ends = time.perf_counter() + BURST_WINDOW_S
                while True:
                    handle.completion = self._runner.submit(handle.request, arrival=handle.arrival)
                    self._live.append(handle)
                    left = burst_ends - time.perf_counter()
                    if idle and left > 0 and len(self._live) < self.batch_size:
                        handle = self._inbox.get(timeout=min(ARRIVAL_GAP_S, left))
                    else:
                        handle = self._inbox.get_nowait()
            except queue.Empty:
                pass
            if not self._live:
                continue
            for h in self._live:
                if h.cancel_reason and h.completion is not None and not h.completion.finish_reason:
                    h.completion.finish_reason = h.cancel_reason
            started = time.perf_counter()
            try:
                self._runner.step()
                self.steps += 1
                self.busy_s += time.perf_counter() - started
            except Exception as exc:  # noqa: BLE001 - one failed step fails its requests, not the server
                log(f"serve: engine step failed: {type(exc).__name__}: {exc}")
                self._fail_all(f"engine error: {type(exc).__name__}: {exc}")
                continue
            self._publish()

    def _publish(self) -> None:
        still = []
        outbox = _Outbox()
        for h in self._live:
            c = h.completion
            assert c is not None
            n = len(c.output_ids)
            if n > h.sent:
                if h.sent == 0:
                    h.admitted_at = c.token_times[0]
                outbox.add(h, ("tokens", c.output_ids[h.sent:n]))
                h.sent = n
            if c.finish_reason:
                outbox.add(h, ("done", c.finish_reason))
                self._leave()
            else:
                still.append(h)
        outbox.send()
        self._live = still
        in_use, total = self._runner.kv_usage()
        self.gauges = {"queue_depth": self._inbox.qsize() + self._runner.num_waiting,
                       "running": self._runner.num_running, "kv_pages_in_use": in_use, "kv_pages_total": total}

    def _leave(self) -> None:
        with self._lock:
            self._in_system -= 1

    def _fail_all(self, message: str) -> None:
        failed = self._live
        while True:
            try:
                failed.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        outbox = _Outbox()
        for h in failed:
            outbox.add(h, ("error", message))
            self._leave()
        outbox.send()
        self._live = []
        if not self._stop.is_set():
            # The runner's state is unknown after a failed step: start over with a fresh cache.
            self._runner = self._new_runner()


class _Outbox:
    """One step's events, sent in order per request: the direct ones at once, the posted ones in one call per
    `post` (Handle)."""

    def __init__(self) -> None:
        self.posted: dict[int, tuple[Callable[..., object], list[tuple[Handle, Event]]]] = {}

    def add(self, handle: Handle, event: Event) -> None:
        if handle.post is None:
            _send(handle, event)
        else:
            self.posted.setdefault(id(handle.post), (handle.post, []))[1].append((handle, event))

    def send(self) -> None:
        for post, events in self.posted.values():
            try:
                post(_deliver_all, events)
            except RuntimeError:
                # The receiving event loop is closed (the HTTP server stopped first): nobody waits for these.
                for handle, _ in events:
                    handle.cancel("cancelled")


def _deliver_all(events: list[tuple[Handle, Event]]) -> None:
    for handle, event in events:
        handle.deliver(event)


def _send(handle: Handle, event: Event) -> None:
    try:
        handle.deliver(event)
    except RuntimeError:
        # The receiving event loop is closed (the HTTP server stopped first): nobody waits for this request.
        handle.cancel("cancelled")
