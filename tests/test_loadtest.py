"""`autotune loadtest` against a real server on loopback: percentiles, JSON, errors counted, loopback only."""
from __future__ import annotations

import json

import pytest
from recipe_factory import Served, tiny_recipe

from autotune.cli import main
from autotune.errors import UserInputError
from autotune.serve.loadtest import check_loopback, one_request


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_folder):
    server = Served(tiny_recipe(tmp_path_factory.mktemp("loadtest"), tiny_model_folder, batch_size=4))
    yield server
    server.close()


def test_loadtest_levels_table_and_json(served, tiny_model_folder, tmp_path, capsys):
    out = tmp_path / "load.json"
    code = main(["loadtest", served.url, "--concurrency", "1,4", "--requests", "6", "--max-tokens", "8",
                 "--prompt-tokens", "16:32", "--tokenizer", str(tiny_model_folder), "--json", str(out)])
    assert code == 0
    table = capsys.readouterr().out
    assert "| concurrency |" in table and "TTFT p99 ms" in table
    result = json.loads(out.read_text())
    assert result["model"] == tiny_model_folder.name and [lv["concurrency"] for lv in result["levels"]] == [1, 4]
    for level in result["levels"]:
        assert level["ok"] == 6 and level["errors"] == 0 and level["throughput_tok_s"] > 0
        assert level["ttft_ms"]["p50"] > 0 and level["ttft_ms"]["p99"] >= level["ttft_ms"]["p50"]
        assert level["tpot_ms"]["p50"] > 0


def test_fixed_length_and_errors_are_counted(served):
    body = {"model": "x", "prompt": "Once upon a time", "max_tokens": 9, "min_tokens": 9, "stream": True,
            "stream_options": {"include_usage": True}}
    outcome = one_request("127.0.0.1", served.port, body)
    assert outcome.ok and outcome.tokens == 9 and outcome.tpot_s is not None
    bad = one_request("127.0.0.1", served.port, {**body, "max_tokens": 0})
    assert not bad.ok and bad.error.startswith("HTTP 400")


def test_only_loopback_targets():
    assert check_loopback("http://127.0.0.1:8000") == ("127.0.0.1", 8000)
    assert check_loopback("http://localhost:9") == ("localhost", 9)
    with pytest.raises(UserInputError, match="loopback"):
        check_loopback("http://8.8.8.8:80")
    assert main(["loadtest", "http://10.1.2.3:8000"]) == 2


def test_a_server_that_is_not_there_is_an_error_not_an_exception():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: the connection is refused
        outcome = one_request("127.0.0.1", port, {"prompt": "x", "max_tokens": 1, "stream": True})
    assert not outcome.ok and outcome.error.startswith("ConnectionRefusedError")


def test_one_thread_drives_every_request_of_a_level(served, monkeypatch):
    """All requests in flight share the calling thread (asyncio), so a level of 4 wakes one client thread per step."""
    import threading

    from autotune.serve import loadtest

    seen: set[int] = set()
    request = loadtest._request

    async def recording(*args, **kwargs):
        seen.add(threading.get_ident())
        return await request(*args, **kwargs)

    monkeypatch.setattr(loadtest, "_request", recording)
    body = {"model": "x", "prompt": "Once upon a time", "max_tokens": 6, "min_tokens": 6, "stream": True}
    level = loadtest.run_level("127.0.0.1", served.port, [body] * 8, concurrency=4)
    assert level.ok == 8 and level.errors == 0 and seen == {threading.get_ident()}


def test_open_loop_levels_judge_the_slo_and_find_goodput(served, tiny_model_folder, tmp_path, capsys):
    """A real server on loopback, driven open-loop: one level at a rate, judged against a loose SLO; then the rate
    search, every rate tried kept."""
    common = ["--requests", "10", "--max-tokens", "6", "--prompt-tokens", "16:32", "--tokenizer",
              str(tiny_model_folder), "--slo", "ttft=10s,tpot=2s"]
    out = tmp_path / "rate.json"
    assert main(["loadtest", served.url, "--rate", "20", *common, "--json", str(out)]) == 0
    level = json.loads(out.read_text())["levels"][0]
    assert level["concurrency"] is None and level["ok"] == 10 and level["attainment"]["attainment"] == 1.0
    assert "open loop" in capsys.readouterr().out
    out = tmp_path / "goodput.json"
    assert main(["loadtest", served.url, *common, "--find-goodput", "--budget", "60", "--json", str(out)]) == 0
    goodput = json.loads(out.read_text())["goodput"]
    assert goodput["met"] and goodput["goodput_req_s"] >= goodput["start_rate"] > 0
    assert all(r["counted"] == 9 for r in goodput["rates"])  # 10 sent, the first not counted
    assert "goodput:" in capsys.readouterr().out


def test_a_failed_request_is_a_miss_and_times_run_from_the_due_time():
    from autotune.config.slo import Slo
    from autotune.serve.loadtest import Outcome, stream_request
    from autotune.serve.open_loop_http import judge, send_at_arrivals

    slo = Slo(1000.0, 100.0)
    ok = Outcome(True, 8, ttft_s=0.2, tpot_s=0.05, latency_s=0.6)
    run = judge([ok, ok, Outcome(False, error="HTTP 503: busy"), ok, Outcome(False, error="timeout")], slo, 1.0, 5.0,
                warmup=1)
    assert (run.counted, run.met, run.missed) == (4, 2, 2) and not run.attained
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: refused at once
        port = s.getsockname()[1]
        outcomes, seconds = send_at_arrivals(stream_request, "127.0.0.1", port, [{"prompt": "x"}] * 3,
                                             [0.0, 0.2, 0.4])
    assert seconds >= 0.4 and all(not o.ok for o in outcomes)
    assert all(o.latency_s < 0.2 for o in outcomes)  # each from its own due time, not from the start
