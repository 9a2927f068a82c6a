"""A real server on loopback, serving a tiny LLaMA whose every token depends on its whole context (in fp32, its
greedy choices decided): concurrency against transformers, bad requests, streaming, overload, metrics."""
from __future__ import annotations

import collections
import http.client
import json
import random
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from recipe_factory import GATE, Served, bench, config, make_study, tiny_recipe

from autotune.models.registry import resolve_model
from autotune.models.weights import load_hf_model, load_tokenizer
from autotune.results.export import write_recipes
from autotune.serve.metrics import ENDPOINTS, OTHER

# Top-1 minus top-2 logit at every greedy position of the reference: a batch's composition moves an fp32 logit by
# about 1e-4 (conftest.py's context_model_folder), so a margin this wide cannot flip by numerics alone.
MIN_MARGIN = 2e-3
MAX_NEW = 12


@pytest.fixture(scope="module")
def recipe_path(tmp_path_factory, context_model_folder):
    return tiny_recipe(tmp_path_factory.mktemp("serve"), context_model_folder, batch_size=8, page_size=16,
                       dtype="fp32")


@pytest.fixture(scope="module")
def served(recipe_path):
    server = Served(recipe_path)
    yield server
    server.close()


@pytest.fixture(scope="module")
def prompts(context_model_folder):
    """32 prompts of real text in pairs: the second of each pair as drawn, the first another text ending in the
    same token (kept only where the pair still shares its last token once its text is tokenized again)."""
    from autotune.gate.corpus import bench_prompts

    tok = load_tokenizer(resolve_model(str(context_model_folder)))
    drawn = bench_prompts(tok, 64, 8, 40, seed=3)
    texts: list[str] = []
    for a, b in zip(drawn[0::2], drawn[1::2]):
        pair = [tok.decode(a[:-1] + b[-1:], skip_special_tokens=True), tok.decode(b, skip_special_tokens=True)]
        first, second = (_encode(tok, t) for t in pair)
        if first[-1] == second[-1] and first != second and len(texts) < 32:
            texts += pair
    assert len(texts) == 32
    return texts, tok


def _encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _transformers_greedy(model_folder, texts, tok, max_new: int) -> tuple[list[list[int]], list[float]]:
    """transformers' greedy continuation of each prompt alone (fp32, eager), and the top-1 minus top-2 logit at
    every position it generated."""
    model = load_hf_model(resolve_model(str(model_folder)))
    outputs, margins = [], []
    for text in texts:
        ids = torch.tensor([_encode(tok, text)])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id, output_logits=True,
                             return_dict_in_generate=True)
        new = out.sequences[0, ids.shape[1]:].tolist()
        outputs.append(new)
        for logits in out.logits[:len(new)]:
            top = logits[0].float().topk(2).values
            margins.append(float(top[0] - top[1]))
    return outputs, margins


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
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 50000000\r\n\r\n{\"prompt\": \"")
        return sock.recv(4096).decode(errors="replace")


@pytest.mark.slow
def test_32_concurrent_requests_equal_transformers_while_bad_requests_are_refused(
        served, prompts, context_model_folder):
    texts, tok = prompts
    expected, margins = _transformers_greedy(context_model_folder, texts, tok, MAX_NEW)
    # The reference is decided (no position a near tie that numerics could flip) ...
    assert len(margins) == sum(map(len, expected)) and min(margins) > MIN_MARGIN, sorted(margins)[:3]
    # ... and depends on more than the last token: each pair ends in the same token and goes on differently. So a
    # request that attended to another's KV pages, or to stale ones of a finished request, would answer differently.
    ids = [_encode(tok, t) for t in texts]
    assert all(ids[i][-1] == ids[i + 1][-1] and expected[i][0] != expected[i + 1][0] for i in range(0, 32, 2))
    bad: list = []
    barrier = threading.Barrier(33)

    def good(text: str):
        barrier.wait()
        return served.post("/generate", {"prompt": text, "max_new_tokens": MAX_NEW})

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
    for (_, a), out in zip(answers, expected):
        assert a["completion_tokens"] == len(out) and a["text"] == tok.decode(out, skip_special_tokens=True)
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
                                                        "stream_options": {"include_usage": True}}),
                 {"Content-Type": "application/json"})
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
    assert status == 200 and health["status"] == "ok" and health["batch_size"] == 8
    assert health["configuration"]["page_size"] == 16 and health["recipe_verified"] is True
    status, text = served.get("/metrics")
    assert status == 200
    for name in ("autotune:requests_total{", "autotune:generation_tokens_total", "autotune:num_requests_waiting",
                 "autotune:num_requests_running", "autotune:kv_pages_in_use",
                 "autotune:time_to_first_token_seconds_bucket", "autotune:inter_token_latency_seconds_bucket",
                 "autotune:e2e_request_latency_seconds_bucket"):
        assert name in text
    assert served.get("/nope")[0] == 404
    status, text = served.get("/openapi.json")
    schema = json.loads(text)
    assert status == 200 and set(ENDPOINTS) - {"/openapi.json"} <= set(schema["paths"])
    body = schema["paths"]["/generate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["prompt"] and body["additionalProperties"] is False


def _random_paths(count: int, seed: int = 0) -> list[str]:
    """What a scanner sends: quotes, backslashes, braces, encoded spaces and newlines, unicode (percent-encoded, as
    a request line must be ASCII), query strings, and paths of thousands of characters."""
    rng = random.Random(seed)
    pieces = ['"', '\\', "{x}", "%20", "%0A", "%22", "'", "admin", "v1", "..", "%", "=", "é", "日本", "🙂", "#"]
    paths = []
    for i in range(count):
        words = [rng.choice(pieces) + str(rng.randrange(10**6)) for _ in range(rng.randint(1, 6))]
        path = "/" + "/".join(words) + ("?q=" + rng.choice(pieces) if i % 7 == 0 else "")
        if i % 50 == 0:
            path = "/" + "a" * rng.randint(2000, 6000) + '"'
        paths.append(quote(path, safe="/?=%\"{}'\\"))
    return paths


def _series(text: str) -> set[tuple[str, tuple]]:
    return {(s.name, tuple(sorted(s.labels.items()))) for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_scanner_of_random_paths_adds_no_metric_series(served):
    served.post("/generate", {"prompt": "one two", "max_new_tokens": 2})
    served.get("/nope")
    before = _series(served.get("/metrics")[1])
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    codes = []
    for i, path in enumerate(_random_paths(1000)):
        conn.request("POST" if i % 3 == 0 else "GET", path, body=b"{}" if i % 3 == 0 else None)
        resp = conn.getresponse()
        resp.read()
        codes.append(resp.status)
        if resp.getheader("Connection") == "close":
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    conn.close()
    assert set(codes) <= {404, 405} and codes.count(404) > 900, collections.Counter(codes)
    status, text = served.get("/metrics")
    after = _series(text)  # and it still parses
    assert status == 200
    # At most the new status codes of the one "other" endpoint (404 and 405 by method) and the /metrics scrape.
    assert len(after - before) <= 3, sorted(after - before)
    endpoints = {dict(labels).get("endpoint") for name, labels in after if name == "autotune:requests_total"}
    assert endpoints <= {*ENDPOINTS, OTHER}, endpoints
    others = sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                 if s.name == "autotune:requests_total" and s.labels["endpoint"] == OTHER)
    assert others >= 1000


def _counter(text: str, name: str, default: float | None = None) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    if match is None and default is not None:
        return default
    return float(match.group(1))


def test_metrics_count_engine_steps_and_the_time_in_them(served):
    before = served.get("/metrics")[1]
    started = time.perf_counter()
    status, _ = served.post("/v1/completions", {"prompt": "one two three", "max_tokens": 9, "min_tokens": 9,
                                                "ignore_eos": True})
    wall = time.perf_counter() - started
    after = served.get("/metrics")[1]
    assert status == 200
    # One request alone: its first step prefills and decodes (two tokens), each further step decodes one.
    steps = _counter(after, "autotune:engine_steps_total") - _counter(before, "autotune:engine_steps_total")
    busy = (_counter(after, "autotune:engine_busy_seconds_total")
            - _counter(before, "autotune:engine_busy_seconds_total"))
    assert steps == 8
    assert 0 < busy <= wall
    for name, grew in (("autotune:time_to_first_token_seconds_count", 1),
                       ("autotune:e2e_request_latency_seconds_count", 1),
                       ("autotune:inter_token_latency_seconds_count", 8), ("autotune:generation_tokens_total", 9),
                       ('autotune:request_success_total{finished_reason="length"}', 1),
                       ('autotune:requests_total{code="200",endpoint="/v1/completions"}', 1)):
        assert _counter(after, name) - _counter(before, name, 0) == grew, name
    assert _counter(after, "autotune:num_requests_running") == 0


def test_a_client_that_leaves_a_stream_frees_its_batch_row(served):
    left = 'autotune:requests_total{code="499",endpoint="/v1/completions"}'
    before = served.get("/metrics")[1]
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": "one two", "max_tokens": 500, "min_tokens": 500,
                                                        "stream": True}), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.readline().startswith(b"data: ")
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    deadline = time.monotonic() + 60
    while True:  # the 499 is counted when the client leaves; the engine frees the row at its next step, after it
        after = served.get("/metrics")[1]
        counted = _counter(after, left, 0) > _counter(before, left, 0)
        if counted and _counter(after, "autotune:num_requests_running") == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert _counter(after, left, 0) - _counter(before, left, 0) == 1
    assert _counter(after, "autotune:num_requests_running") == 0
    # Cancelled at its next step, far before its 500 tokens.
    assert _counter(after, "autotune:engine_steps_total") - _counter(before, "autotune:engine_steps_total") < 400


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


@pytest.mark.slow
def test_a_goodput_recipe_says_its_goodput_at_start_and_in_health(tmp_path, context_model_folder, capsys):
    goodput = {"slo": {"ttft_ms": 1000.0, "tpot_ms": 100.0, "attainment": 0.9}, "met": True, "goodput_req_s": 2.5,
               "goodput_tok_s": 40.0, "rates": [{"rate": 2.5, "attainment": 0.95, "counted": 20}]}
    study, url = make_study(tmp_path, context_model_folder, tmp_path, name="goodput",
                            points=[(config(dtype="fp32"), bench(200.0, 10.0, 100.0), GATE, {})],
                            trial_attrs={"goodput": goodput})
    path = next(p for p in write_recipes(study, tmp_path / "recipes", url) if p.name == "best-throughput.yaml")
    server = Served(path)
    try:
        status, text = server.get("/health")
    finally:
        server.close()
    said = json.loads(text)["goodput"]
    assert status == 200 and said == {k: goodput[k] for k in ("slo", "met", "goodput_req_s", "goodput_tok_s")}
    assert "within TTFT 1000 ms and TPOT 100 ms for 90% of requests: 2.5 req/s (40.0 output tok/s)" in \
        capsys.readouterr().err
