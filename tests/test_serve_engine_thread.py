"""`autotune serve` runs its engine loop on the thread that built it, HTTP on another (autotune/serve/engine_loop.py
says why: a second thread running torch's OpenMP halves CPU throughput), and stops cleanly on SIGTERM."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading

from recipe_factory import tiny_recipe

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
