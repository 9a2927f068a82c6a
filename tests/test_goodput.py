"""Workloads that arrive, the SLO, the open-loop run and the goodput rate search: against a fake step runner on a
virtual clock whose service times are known, so that the queueing answer is known too."""
from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from autotune.benchmark.goodput import find_goodput, goodput_workload
from autotune.benchmark.open_loop import run_open_loop, wilson_interval
from autotune.config.arrival import LoadRequest, arrival_times, load_requests, output_lengths
from autotune.config.slo import Slo, parse_slo
from autotune.config.workload import Workload
from autotune.engine.sequence import Completion


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeRunner:
    """A step runner of known service: each step takes `step_s` of the virtual clock and gives every running
    sequence one token (its first step: the prompt's prefill and its first token); `max_batch` run together, the
    rest wait in arrival order."""

    def __init__(self, clock: Clock, max_batch: int, step_s: float) -> None:
        self.clock, self.max_batch, self.step_s = clock, max_batch, step_s
        self.waiting: list[Completion] = []
        self.running: list[Completion] = []
        self.steps = 0

    def submit(self, request, arrival=None) -> Completion:
        c = Completion(request, arrival=self.clock() if arrival is None else arrival)
        self.waiting.append(c)
        return c

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def kv_usage(self):
        return 0, 0

    def warm_up(self) -> None:
        pass

    def step(self) -> list[Completion]:
        done = [c for c in self.waiting + self.running if c.finish_reason]
        self.waiting = [c for c in self.waiting if not c.finish_reason]
        self.running = [c for c in self.running if not c.finish_reason]
        while self.waiting and len(self.running) < self.max_batch:
            self.running.append(self.waiting.pop(0))
        self.clock.now += self.step_s
        self.steps += 1
        for c in self.running:
            c.output_ids.append(1)
            c.token_times.append(self.clock.now)
            if len(c.output_ids) >= c.request.max_new_tokens:
                c.finish_reason = "length"
        done += [c for c in self.running if c.finish_reason]
        self.running = [c for c in self.running if not c.finish_reason]
        return done


def _evenly(rate: float, n: int, new_tokens: int) -> list[LoadRequest]:
    return [LoadRequest(i / rate, [1, 2, 3], new_tokens) for i in range(n)]


# -- arrivals ---------------------------------------------------------------------------------------------------------
def test_offline_workloads_keep_their_stored_form():
    assert Workload().to_dict() == {"num_requests": 16, "prompt_min": 112, "prompt_max": 144, "output_tokens": 64,
                                    "arrival": "offline", "seed": 0}
    w = Workload(arrival="poisson", rate=2.0, burstiness=0.5, output_min=8)
    assert Workload(**w.to_dict()) == w


@pytest.mark.parametrize("bad, words", [
    (dict(arrival="poisson"), "needs a rate"), (dict(arrival="bursty", rate=1.0), "unknown arrival"),
    (dict(rate=1.0), "offline arrival has no rate"), (dict(arrival="poisson", rate=1.0, burstiness=0), "gamma shape"),
    (dict(output_min=65), "output_min <= output_tokens")])
def test_bad_workloads_are_refused(bad, words):
    with pytest.raises(ValueError, match=words):
        Workload(**bad)


def test_arrivals_are_seeded_and_have_the_asked_rate():
    w = Workload(num_requests=4000, arrival="poisson", rate=5.0, seed=3)
    times = arrival_times(w)
    assert times == arrival_times(w) and times != arrival_times(replace(w, seed=4))
    gaps = [b - a for a, b in zip(times, times[1:])]
    # Exponential gaps of mean 0.2 s: the mean of 3,999 is within 5% (about 3 standard errors), CV about 1.
    assert statistics.mean(gaps) == pytest.approx(0.2, rel=0.05)
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, rel=0.07)
    # Burstiness is the gamma shape: CV = 1/sqrt(shape), at the same mean gap.
    bursty = [b - a for a, b in zip(*(lambda t: (t, t[1:]))(arrival_times(replace(w, burstiness=0.25))))]
    assert statistics.mean(bursty) == pytest.approx(0.2, rel=0.1)
    assert statistics.stdev(bursty) / statistics.mean(bursty) == pytest.approx(2.0, rel=0.1)
    assert arrival_times(Workload()) == [0.0] * 16


def test_output_lengths_are_drawn_within_their_range():
    w = Workload(num_requests=2000, output_min=32, output_tokens=96, seed=1)
    lengths = output_lengths(w)
    assert min(lengths) == 32 and max(lengths) == 96 and lengths == output_lengths(w)
    assert statistics.mean(lengths) == pytest.approx(w.mean_output_tokens, rel=0.03)
    assert output_lengths(Workload()) == [64] * 16
    with pytest.raises(ValueError, match="3 prompts for a workload of 16"):
        load_requests(Workload(), [[1]] * 3)


# -- the SLO --------------------------------------------------------------------------------------------------------
def test_slos_are_read_in_seconds_or_milliseconds():
    assert parse_slo("ttft=1s,tpot=100ms") == Slo(1000.0, 100.0, 0.9)
    assert parse_slo(" tpot=0.05s , TTFT=250ms", 0.95) == Slo(250.0, 50.0, 0.95)
    for bad in ("ttft=1s", "ttft=1,tpot=100ms", "ttft=1s,tpot=100ms,ttft=2s", "latency=1s,tpot=1s", ""):
        with pytest.raises(ValueError, match="expected ttft=DURATION,tpot=DURATION"):
            parse_slo(bad)
    with pytest.raises(ValueError, match="attainment"):
        Slo(1.0, 1.0, 1.5)
    slo = Slo(100.0, 10.0)
    assert slo.met(100.0, 10.0) and slo.met(50.0, None) and not slo.met(101.0, 1.0) and not slo.met(None, None)


def test_wilson_interval_holds_its_share_and_stays_in_bounds():
    lo, hi = wilson_interval(45, 50)
    assert lo < 0.9 < hi and lo == pytest.approx(0.786, abs=0.002) and hi == pytest.approx(0.957, abs=0.002)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)


# -- the open-loop run and the rate search ---------------------------------------------------------------------------
def test_an_idle_engine_serves_every_request_at_its_service_time():
    clock = Clock()
    runner = FakeRunner(clock, max_batch=1, step_s=0.01)
    run = run_open_loop(runner, _evenly(5.0, 20, 10), Slo(15.0, 10.5), 5.0, clock=clock, sleep=clock.sleep)
    # Requests 0.2 s apart, each served in 10 steps of 10 ms: none waits; TTFT one step, TPOT one step.
    assert run.attained and run.met == run.counted == 18 and not run.stopped_early
    assert run.ttft_p99_ms == pytest.approx(10.0) and run.tpot_p99_ms == pytest.approx(10.0)
    assert run.queue_growth == 0 and runner.steps == 200


def test_time_is_counted_from_the_due_time_not_from_admission():
    """Two requests due together on a batch of one: the second waits the first's 10 steps, and its TTFT says so."""
    clock = Clock()
    runner = FakeRunner(clock, max_batch=1, step_s=0.01)
    load = [LoadRequest(0.0, [1], 10), LoadRequest(0.0, [1], 10)]
    run = run_open_loop(runner, load, Slo(1000.0, 1000.0), 1.0, clock=clock, sleep=clock.sleep, warmup=0)
    # TTFTs of 10 ms and 110 ms (10 steps of the first, then its own first step): their median is 60.
    assert run.ttft_p50_ms == pytest.approx(60.0)


def test_an_overloaded_engine_stops_early_once_the_target_is_out_of_reach():
    clock = Clock()
    runner = FakeRunner(clock, max_batch=1, step_s=0.01)
    # 20 req/s against a service rate of 10 req/s: the queue grows by one request every 0.1 s.
    run = run_open_loop(runner, _evenly(20.0, 100, 10), Slo(50.0, 100.0), 20.0, clock=clock, sleep=clock.sleep)
    assert not run.attained and run.stopped_early and run.missed > 9
    assert run.seconds < 100 / 20.0  # before the last arrival
    assert runner.num_waiting == runner.num_running == 0  # what was left was cancelled and left the runner


@pytest.mark.parametrize("batch", [1, 4])
def test_the_rate_search_finds_the_known_service_rate(batch):
    """D/D/c: requests of 10 tokens, one 10 ms step each, `batch` at a time: the engine serves 10 * batch requests
    a second. Below that nobody waits (TTFT one step); above it the queue, and every later request's wait, grows
    without bound, and a 50 ms TTFT limit is soon missed. So goodput is the service rate, within the search's
    precision."""
    clock = Clock()
    runner = FakeRunner(clock, max_batch=batch, step_s=0.01)
    slo = Slo(50.0, 20.0)

    def measure(rate: float):
        return run_open_loop(runner, _evenly(rate, 60, 10), slo, rate, clock=clock, sleep=clock.sleep)

    out = find_goodput(measure, 3.0 * batch, slo, budget_s=1e9, clock=clock)
    service = 10.0 * batch
    assert out["met"] and service / 1.15 <= out["goodput_req_s"] <= service * 1.05, out
    assert out["lowest_missed_req_s"] / out["goodput_req_s"] <= 1.1 + 1e-9
    assert [r["rate"] for r in out["rates"]][:3] == [3.0 * batch, 6.0 * batch, 12.0 * batch]  # doubled, then bisected


def test_an_slo_no_rate_meets_is_recorded_with_the_best_attainment():
    clock = Clock()
    runner = FakeRunner(clock, max_batch=1, step_s=0.01)
    slo = Slo(5.0, 20.0)  # a TTFT below one step: no request can meet it

    def measure(rate: float):
        return run_open_loop(runner, _evenly(rate, 40, 10), slo, rate, clock=clock, sleep=clock.sleep)

    out = find_goodput(measure, 8.0, slo, budget_s=1e9, clock=clock)
    assert not out["met"] and out["goodput_req_s"] == 0.0 and out["best_attainment"] == 0.0
    assert len(out["rates"]) == 6 and "no rate tried met the SLO" in out["note"]


def test_the_budget_bounds_the_search():
    clock = Clock()
    runner = FakeRunner(clock, max_batch=1, step_s=0.01)
    slo = Slo(50.0, 20.0)
    out = find_goodput(lambda r: run_open_loop(runner, _evenly(r, 60, 10), slo, r, clock=clock, sleep=clock.sleep),
                       1.0, slo, budget_s=1.0, clock=clock)
    assert len(out["rates"]) == 2  # a probe at 1 req/s takes a minute: the first two run, then the budget is spent


def test_a_probe_workload_draws_around_the_offline_lengths():
    w = goodput_workload(Workload(), 2.5)
    assert (w.arrival, w.rate, w.output_min, w.output_tokens, w.num_requests) == ("poisson", 2.5, 32, 64, 40)
