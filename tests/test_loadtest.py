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
