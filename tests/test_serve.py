"""A real server on loopback, serving a tiny random LLaMA: concurrency, bad requests, streaming, overload."""
from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from recipe_factory import Served, tiny_recipe

from autotune.engine import Request, build_engine
from autotune.models.registry import resolve_model
from autotune.models.weights import load_hf_model, load_tokenizer


@pytest.fixture(scope="module")
def recipe_path(tmp_path_factory, decided_model_folder):
    return tiny_recipe(tmp_path_factory.mktemp("serve"), decided_model_folder, batch_size=4, page_size=16)


@pytest.fixture(scope="module")
def served(recipe_path):
    server = Served(recipe_path)
    yield server
    server.close()


@pytest.fixture(scope="module")
def prompts(decided_model_folder):
    from autotune.gate.corpus import bench_prompts

    tok = load_tokenizer(resolve_model(str(decided_model_folder)))
    texts = [tok.decode(p, skip_special_tokens=True) for p in bench_prompts(tok, 32, 8, 40, seed=3)]
    return texts, tok


def _offline(model_folder, recipe_path, texts, tok, max_new: int) -> list[list[int]]:
    """What the offline engine produces for the same prompts (greedy), all at once through Runner.run."""
    from autotune.recipes.recipe import load_recipe

    recipe = load_recipe(recipe_path)
    engine = build_engine(load_hf_model(resolve_model(str(model_folder))), recipe.config)
    runner = engine.runner(max_seq_len=recipe.max_seq_len)
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    return [c.output_ids for c in runner.run([Request(i, max_new, eos_token_id=tok.eos_token_id) for i in ids])]


def _bad_requests(served, max_seq_len: int) -> list[tuple[int, str]]:
    long_prompt = "word " * (max_seq_len + 10)
    cases = [
        (b"{not json", None), (None, {"max_new_tokens": 4}), (None, {"prompt": 7}),
        (None, {"prompt": "hi", "max_new_tokens": 0}), (None, {"prompt": "hi", "max_new_tokens": 10**6}),
        (None, {"prompt": "hi", "max_new_tokens": "4"}), (None, {"prompt": "hi", "max_new_tokens": True}),
        (None, {"prompt": long_prompt, "max_new_tokens": 4}), (None, {"prompt": "hi", "temperature": -1}),
        (None, {"prompt": "hi", "max_tokens": 4}), (b"[1, 2]", None), (None, {"prompt": "hi", "stop": [1]}),
    ]
    out = []
    for raw, body in cases:
        status, data = served.post("/generate", body, raw=raw)
        out.append((status, data.get("error", {}).get("message", "")))
    status, data = served.post("/v1/completions", {"prompt": "hi", "n": 3})
    out.append((status, data["error"]["message"]))
    return out


def _oversized(port: int) -> str:
    # Claim a body far over the limit: the server must answer 413 without reading it.
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 50000000\r\n\r\n{\"prompt\": \"")
        return sock.recv(4096).decode(errors="replace")


def test_32_concurrent_requests_match_offline_engine_while_bad_requests_are_refused(
        served, prompts, decided_model_folder, recipe_path):
    texts, tok = prompts
    expected = _offline(decided_model_folder, recipe_path, texts, tok, 12)
    bad: list = []
    barrier = threading.Barrier(33)

    def good(text: str):
        barrier.wait()
        return served.post("/generate", {"prompt": text, "max_new_tokens": 12})

    def misbehave():
        barrier.wait()
        bad.extend(_bad_requests(served, 512))
        bad.append((413 if " 413 " in _oversized(served.port) else 0, "oversized"))

    with ThreadPoolExecutor(33) as pool:
        futures = [pool.submit(good, t) for t in texts]
        pool.submit(misbehave).result()
        answers = [f.result() for f in futures]
    assert all(status == 200 for status, _ in answers), [a for a in answers if a[0] != 200][:2]
    assert [a["token_ids"] for _, a in answers] == expected
    for (_, a), ids in zip(answers, expected):
        assert a["completion_tokens"] == len(ids) and a["text"] == tok.decode(ids, skip_special_tokens=True)
        assert a["timings"]["ttft_ms"] > 0
    assert len(bad) == 14 and all(400 <= status < 500 for status, _ in bad), bad
    assert all(message for _, message in bad)
    assert any("malformed JSON" in m for _, m in bad) and any("512" in m for _, m in bad)


def test_openai_completions_streaming_equals_non_streaming(served, prompts):
    texts, _ = prompts
    body = {"model": "tiny", "prompt": texts[0], "max_tokens": 10, "temperature": 0}
    status, plain = served.post("/v1/completions", body)
    assert status == 200 and plain["object"] == "text_completion"
    assert plain["usage"]["completion_tokens"] == 10 and plain["choices"][0]["finish_reason"] == "length"
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True,
                                                        "stream_options": {"include_usage": True}}))
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
    events = [line[6:] for line in resp.read().decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == plain["choices"][0]["text"]
    assert chunks[-1]["usage"]["completion_tokens"] == 10


def test_stop_string_cuts_the_text(served, prompts):
    texts, _ = prompts
    _, full = served.post("/generate", {"prompt": texts[1], "max_new_tokens": 12})
    stop = full["text"][len(full["text"]) // 2:][:3]
    _, cut = served.post("/generate", {"prompt": texts[1], "max_new_tokens": 12, "stop": stop})
    assert cut["finish_reason"] == "stop" and cut["text"] == full["text"][:full["text"].find(stop)]


def test_health_and_metrics(served):
    status, text = served.get("/health")
    health = json.loads(text)
    assert status == 200 and health["status"] == "ok" and health["batch_size"] == 4
    assert health["configuration"]["page_size"] == 16 and health["recipe_verified"] is True
    status, text = served.get("/metrics")
    assert status == 200
    for name in ("autotune_requests_total{", "autotune_generation_tokens_total", "autotune_queue_depth",
                 "autotune_kv_pages_in_use"):
        assert name in text
    assert served.get("/nope")[0] == 404


def _counter(text: str, name: str) -> float:
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def test_metrics_count_engine_steps_and_the_time_in_them(served):
    before = served.get("/metrics")[1]
    started = time.perf_counter()
    status, _ = served.post("/v1/completions", {"prompt": "one two three", "max_tokens": 9, "min_tokens": 9,
                                                "ignore_eos": True})
    wall = time.perf_counter() - started
    after = served.get("/metrics")[1]
    assert status == 200
    # One request alone: its first step prefills and decodes (two tokens), each further step decodes one.
    steps = _counter(after, "autotune_engine_steps_total") - _counter(before, "autotune_engine_steps_total")
    busy = (_counter(after, "autotune_engine_busy_seconds_total")
            - _counter(before, "autotune_engine_busy_seconds_total"))
    assert steps == 8
    assert 0 < busy <= wall


def test_overload_gets_503_and_the_admitted_requests_finish(recipe_path):
    server = Served(recipe_path, max_queue=1)
    try:
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(
                lambda i: server.post("/generate", {"prompt": f"number {i} is", "max_new_tokens": 64}), range(16)))
        codes = sorted(status for status, _ in answers)
        assert 503 in codes and 200 in codes and set(codes) <= {200, 503}
        assert all(a["completion_tokens"] == 64 for status, a in answers if status == 200)
        assert all("retry later" in a["error"]["message"] for status, a in answers if status == 503)
    finally:
        server.close()
