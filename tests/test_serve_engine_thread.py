"""`autotune serve` runs its engine loop on the thread that built it, HTTP on another (autotune/serve/engine_loop.py
says why: a second thread running torch's OpenMP halves CPU throughput), and stops cleanly on SIGTERM."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from recipe_factory import tiny_recipe

from autotune.engine import Request
from autotune.recipes.recipe import load_recipe
from autotune.serve import build_server
from autotune.serve.loadtest import one_request

BODY = {"model": "m", "prompt": "The licence grants", "max_tokens": 6, "min_tokens": 6, "ignore_eos": True,
        "stream": True, "temperature": 0.0, "stream_options": {"include_usage": True}}


def test_the_engine_loop_runs_on_the_calling_thread(tmp_path, decided_model_folder, monkeypatch):
    server = build_server(load_recipe(tiny_recipe(tmp_path, decided_model_folder, batch_size=2)), "127.0.0.1", 0,
                          engine_here=True)
    engine_loop = server.app.engine_loop
    stepped_on: set[int] = set()
    step = engine_loop._runner.step

    def spy():
        stepped_on.add(threading.get_ident())
        return step()

    monkeypatch.setattr(engine_loop._runner, "step", spy)
    server.start()
    outcomes = []

    def client() -> None:
        try:
            outcomes.extend(one_request("127.0.0.1", server.server_address[1], BODY) for _ in range(2))
        finally:
            engine_loop.stop()

    threading.Thread(target=client).start()
    engine_loop.run()  # returns when the client stops it
    server.stop()
    assert [o.tokens for o in outcomes] == [6, 6] and all(o.ok for o in outcomes), outcomes
    assert stepped_on == {threading.get_ident()}


@pytest.mark.slow
def test_autotune_serve_answers_then_stops_on_sigterm(tmp_path, decided_model_folder):
    recipe = tiny_recipe(tmp_path, decided_model_folder, batch_size=2)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "autotune.cli", "serve", str(recipe), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        port = None
        for line in proc.stdout:
            if match := re.match(r"serving .* on http://127\.0\.0\.1:(\d+) ", line):
                port = int(match.group(1))
                break
        assert port, "autotune serve exited before serving"
        outcome = one_request("127.0.0.1", port, BODY)
        assert outcome.ok and outcome.tokens == 6, outcome
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=60)[0]
        assert proc.returncode == 0, rest
        assert "shutting down" in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_burst_that_finds_the_engine_idle_is_prefilled_as_one(tmp_path, decided_model_folder, monkeypatch):
    """Requests arriving a couple of milliseconds apart (as HTTP handlers hand them over) on an idle engine go into
    one prefill forward, as offline, not the first alone and the rest beside its decode."""
    server = build_server(load_recipe(tiny_recipe(tmp_path, decided_model_folder, batch_size=4)), "127.0.0.1", 0)
    engine_loop = server.app.engine_loop
    forwards: list[int] = []
    prefill = engine_loop._runner.model.prefill
    monkeypatch.setattr(engine_loop._runner.model, "prefill", lambda ids, *a: forwards.append(len(ids)) or
                        prefill(ids, *a))
    done = threading.Semaphore(0)
    try:
        for _ in range(4):
            engine_loop.submit(Request([5, 6, 7, 8], 4, min_new_tokens=4),
                               lambda event: event[0] in ("done", "error") and done.release())
            time.sleep(0.002)
        for _ in range(4):
            assert done.acquire(timeout=60)
    finally:
        engine_loop.stop()
    assert forwards == [4], forwards


def test_an_event_loops_requests_get_one_wake_up_per_engine_step(tmp_path, decided_model_folder):
    """Requests submitted with `post` (an event loop's call_soon_threadsafe) have all of a step's events handed over
    in one call, each request's in order; without it, one call per request per step."""
    server = build_server(load_recipe(tiny_recipe(tmp_path, decided_model_folder, batch_size=4)), "127.0.0.1", 0)
    engine_loop = server.app.engine_loop
    posts: list[int] = []
    events: dict[int, list] = {i: [] for i in range(4)}
    done = threading.Semaphore(0)

    def post(deliver_all, batch):  # what the engine thread calls; here the events are delivered on that thread
        posts.append(len(batch))
        deliver_all(batch)

    def deliver(i):
        return lambda event: events[i].append(event) or (event[0] in ("done", "error") and done.release())

    try:
        steps_before = engine_loop.steps
        for i in range(4):
            engine_loop.submit(Request([5, 6, 7, 8], 6, min_new_tokens=6), deliver(i), post=post)
        for _ in range(4):
            assert done.acquire(timeout=60)
        steps = engine_loop.steps - steps_before
    finally:
        engine_loop.stop()
    for i in range(4):
        assert [e[0] for e in events[i]][-1] == "done"
        assert sum(len(v) for k, v in events[i] if k == "tokens") == 6
    # One call per step that had events (a step's 4 requests together), never one per request.
    assert len(posts) <= steps and sum(posts) == sum(len(e) for e in events.values()) and max(posts) >= 4
