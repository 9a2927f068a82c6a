"""The server against a web page, a slow client and a careless one: a real server on loopback (uvicorn, real
sockets), serving the tiny LLaMA. Cross-site form POSTs, a foreign Host, a missing key, 200 clients that send half
a body and stop, a megabyte prompt, too many or too long stop strings: each refused with its status and counted by
reason in /metrics, while /health and real requests are answered in their usual time."""
from __future__ import annotations

import http.client
import json
import resource
import socket
import statistics
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from recipe_factory import Served, tiny_recipe

from autotune.serve.guard import Access, allowed_hosts

KEY = "test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
HEADER_TIMEOUT_S, BODY_TIMEOUT_S = 3.0, 6.0
SLOW_CLIENTS = 200


@pytest.fixture(scope="module")
def served(tmp_path_factory, context_model_folder):
    recipe = tiny_recipe(tmp_path_factory.mktemp("guard"), context_model_folder, batch_size=4, page_size=16,
                         dtype="fp32")
    server = Served(recipe, access=Access(api_key=KEY, header_timeout_s=HEADER_TIMEOUT_S,
                                          body_timeout_s=BODY_TIMEOUT_S))
    yield server
    server.close()


def _request(served, method: str, path: str, body: bytes = b"", headers: dict | None = None,
             timeout: float = 120) -> tuple[int, dict, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=timeout)
    conn.request(method, path, body, {"Content-Type": "application/json", **AUTH, **(headers or {})})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, dict(resp.getheaders()), json.loads(data) if data.startswith(b"{") else {"raw": data}


def _refused(served) -> dict[str, float]:
    status, _, data = _request(served, "GET", "/metrics")
    text = data["raw"].decode()
    return {s.labels["reason"]: s.value for f in text_string_to_metric_families(text)
            if f.name == "autotune:requests_refused" for s in f.samples if s.name.endswith("_total")}


def _generate(served, **body) -> tuple[int, dict]:
    status, _, data = _request(served, "POST", "/generate", json.dumps({"prompt": "the cat", **body}).encode())
    return status, data


def test_cross_site_form_posts_get_415(served):
    before = _refused(served)
    # What a page on another origin can make a browser send without a preflight: the three form encodings.
    for content_type, body in (("application/x-www-form-urlencoded", b"prompt=hi"),
                               ("multipart/form-data; boundary=x", b'--x\r\nContent-Disposition: form-data; '
                                b'name="prompt"\r\n\r\nhi\r\n--x--\r\n'),
                               ("text/plain", b'{"prompt": "hi"}')):
        status, _, data = _request(served, "POST", "/generate", body,
                                   {"Content-Type": content_type, "Origin": "https://evil.example"})
        assert status == 415, (content_type, status, data)
        assert "Content-Type must be application/json" in data["error"]["message"]
    status, _, _ = _request(served, "POST", "/v1/completions", b'{"prompt": "hi"}', {"Content-Type": ""})
    assert status == 415
    # JSON with a charset parameter is JSON.
    status, _, data = _request(served, "POST", "/generate", b'{"prompt": "hi", "max_new_tokens": 2}',
                               {"Content-Type": "application/json; charset=utf-8"})
    assert status == 200 and data["completion_tokens"] == 2
    assert _refused(served)["content_type"] - before.get("content_type", 0) == 4


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.evil.example", "[::2]:80", ""])
def test_a_foreign_host_gets_421_on_every_path(served, host):
    before = _refused(served).get("host", 0)
    for method, path in (("GET", "/health"), ("GET", "/metrics"), ("POST", "/generate")):
        with socket.create_connection(("127.0.0.1", served.port), timeout=30) as sock:
            body = b'{"prompt": "hi"}' if method == "POST" else b""
            head = f"{method} {path} HTTP/1.1\r\n" + (f"Host: {host}\r\n" if host else "")
            sock.sendall(f"{head}Content-Type: application/json\r\nAuthorization: Bearer {KEY}\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            answer = sock.recv(4096).decode(errors="replace")
        assert answer.startswith("HTTP/1.1 421"), (host, path, answer[:200])
        assert "--allowed-host" in answer
    assert _refused(served)["host"] - before == 3


def test_local_names_and_added_ones_are_served():
    names = allowed_hosts("127.0.0.1", ("Api.Example.COM",))
    assert {"localhost", "127.0.0.1", "::1", "api.example.com"} <= names and "evil.example" not in names
    assert "0.0.0.0" not in allowed_hosts("0.0.0.0", ())  # a wildcard bind is no name a client sends


def test_the_api_key_is_required_except_on_health(served):
    before = _refused(served).get("auth", 0)
    for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong-key-0123456789"},
                    {"Authorization": f"Basic {KEY}"}):
        status, response_headers, data = _request(served, "POST", "/generate", b'{"prompt": "hi"}', headers)
        assert status == 401 and response_headers.get("www-authenticate") == "Bearer", data
        status, _, _ = _request(served, "GET", "/metrics", headers=headers)
        assert status == 401
    status, _, data = _request(served, "GET", "/health", headers={"Authorization": ""})
    assert status == 200 and data["status"] == "ok"
    assert _refused(served)["auth"] - before == 6


def _slow_body_clients(port: int, n: int) -> list[socket.socket]:
    """`n` clients that send their headers and 10 bytes of a 1000-byte body, then nothing."""
    socks = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        sock.sendall(f"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     f"Authorization: Bearer {KEY}\r\nContent-Length: 1000\r\n\r\n".encode() + b'{"prompt":')
        socks.append(sock)
    return socks


def _timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


@pytest.mark.slow
def test_200_slow_body_clients_leave_the_server_answering(served):
    """While 200 clients hold half-sent bodies: /health within 1 s and a real request in its usual time; then each
    slow client gets a 408 at the body deadline, counted, and nothing is lost."""
    def health() -> None:
        assert _request(served, "GET", "/health")[0] == 200

    def generate() -> None:
        status, data = _generate(served, max_new_tokens=8)
        assert status == 200 and data["completion_tokens"] == 8

    generate()  # warm
    usual = statistics.median(_timed(generate) for _ in range(3))
    before = _refused(served).get("body_timeout", 0)
    socks = _slow_body_clients(served.port, SLOW_CLIENTS)
    held_since = time.monotonic()
    try:
        # The server first takes in the burst of 200 connections this test opened back to back (a fresh-clone CI
        # run timed 1.2 s for the request queued behind them); what is timed is the answer while they are held.
        health()
        health_s = [_timed(health) for _ in range(20)]
        loaded = [_timed(generate) for _ in range(5)]
        held_for = time.monotonic() - held_since
        assert held_for < BODY_TIMEOUT_S, "the requests under load took past the slow clients' deadline"
        assert max(health_s) < 1.0, health_s
        assert statistics.median(loaded) < 2 * usual + 0.25, (usual, loaded)
        answers = []
        for sock in socks:
            data = b""
            while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
            answers.append(data.decode(errors="replace"))
    finally:
        for sock in socks:
            sock.close()
    assert all(a.startswith("HTTP/1.1 408") and "did not arrive within" in a for a in answers), answers[:2]
    assert _refused(served)["body_timeout"] - before == SLOW_CLIENTS
    print(f"slow-body load: {SLOW_CLIENTS} connections held, {len(health_s)} /health (max {max(health_s) * 1e3:.0f} "
          f"ms) and {len(loaded)} /generate (median {statistics.median(loaded) * 1e3:.0f} ms, usual "
          f"{usual * 1e3:.0f} ms) served, 0 lost; {SLOW_CLIENTS} answered 408 at {BODY_TIMEOUT_S:g} s")


@pytest.mark.slow
def test_a_client_that_never_finishes_its_headers_gets_408(served):
    before = _refused(served).get("header_timeout", 0)
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        answer = sock.recv(4096).decode(errors="replace")
        assert sock.recv(4096) == b""  # and closed
    assert answer.startswith("HTTP/1.1 408") and "headers did not arrive" in answer
    assert HEADER_TIMEOUT_S - 0.5 < time.monotonic() - started < HEADER_TIMEOUT_S + 10
    assert _refused(served)["header_timeout"] - before == 1


class _CountingTokenizer:
    """The server's tokenizer, recording the length of every text it is asked to encode."""

    def __init__(self, inner) -> None:
        self.inner, self.encoded = inner, []

    def __call__(self, text, *args, **kw):
        self.encoded.append(len(text))
        return self.inner(text, *args, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_megabyte_prompt_is_refused_without_being_tokenized(served):
    app = served.server.app
    counting = app.tokenizer = _CountingTokenizer(app.tokenizer)
    try:
        before = _refused(served).get("prompt_bytes", 0)
        prompt = "word " * ((1 << 20) // 5 - 40)  # the body just under the 1 MiB body limit
        started = time.perf_counter()
        status, data = _generate(served, prompt=prompt)
        refused_s = time.perf_counter() - started
        assert status == 400 and "bytes" in data["error"]["message"], data
        assert not any(n > 1000 for n in counting.encoded), "the megabyte prompt was tokenized"
        assert _refused(served)["prompt_bytes"] - before == 1
        # The bound is no tighter than the tokens: a prompt under it, but over the context, is refused by its tokens.
        limit = app.limits.max_prompt_bytes
        status, data = _generate(served, prompt="word " * (app.limits.max_seq_len + 10))
        assert status == 400 and "tokens" in data["error"]["message"] and limit > 5 * (app.limits.max_seq_len + 10)
        print(f"1 MiB prompt refused in {refused_s * 1e3:.0f} ms (byte limit {limit})")
    finally:
        app.tokenizer = counting.inner


def test_stop_strings_are_capped_in_number_and_length(served):
    before = _refused(served).get("stop_strings", 0)
    for stop in (["a", "b", "c", "d", "e"], "x" * 65, ["ok", "y" * 200]):
        status, data = _generate(served, stop=stop)
        assert status == 400 and "at most 4" in data["error"]["message"] and "64 characters" in data["error"]["message"]
    status, data = _generate(served, stop=["a", "b", "c", "z" * 64], max_new_tokens=2)
    assert status == 200, data
    assert _refused(served)["stop_strings"] - before == 3


def _raw(port: int, head: str, first_bytes: bytes = b"", timeout: float = 30) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(head.encode() + first_bytes)
    return sock


def _answer_and_close(sock: socket.socket) -> tuple[str, float]:
    """Everything the server sends until it closes the connection, and how long that took."""
    started, data = time.monotonic(), b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except ConnectionResetError:  # closed with bytes of ours unread: a reset rather than an orderly close
        pass
    return data.decode(errors="replace"), time.monotonic() - started


def test_a_body_where_none_is_read_is_answered_and_the_connection_closed(served):
    # /health reads no body: answered at once, then closed, not held until a deadline while bytes trickle in.
    with _raw(served.port, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000000\r\n\r\n", b"{") as sock:
        answer, took = _answer_and_close(sock)
    assert answer.startswith("HTTP/1.1 200") and "connection: close" in answer.lower(), answer
    assert took < BODY_TIMEOUT_S / 2, took
    # Without a body, the connection is kept for the next request as usual.
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    for _ in range(2):
        conn.request("GET", "/health")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("connection") != "close"
        resp.read()
    conn.close()


def test_a_refusal_closes_the_connection_with_the_body_unread(served):
    before = _refused(served)
    head = ("POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n{auth}\r\n")
    with _raw(served.port, head.format(auth=""), b'{"prompt":') as sock:  # no key: 401
        answer, took = _answer_and_close(sock)
    assert answer.startswith("HTTP/1.1 401") and "connection: close" in answer.lower(), answer
    assert took < BODY_TIMEOUT_S / 2, took
    chunked = head.replace("Content-Length: 1000", "Transfer-Encoding: chunked").format(
        auth=f"Authorization: Bearer {KEY}\r\n")
    with _raw(served.port, chunked, b"5\r\n{\"pro") as sock:
        answer, took = _answer_and_close(sock)
    assert answer.startswith("HTTP/1.1 411") and "chunked bodies are not accepted" in answer, answer
    assert took < BODY_TIMEOUT_S / 2, took
    after = _refused(served)
    assert after["auth"] - before.get("auth", 0) == 1 and after["length"] - before.get("length", 0) == 1


def _more_files(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"this test needs {wanted} open files; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


@pytest.mark.slow
def test_1024_clients_holding_bodies_on_health_leave_requests_answered_within_1s(served):
    """As many clients as the connection limit (1,024) each send /health a Content-Length of a megabyte and the
    body's first byte: each is answered and closed rather than held for the rest, so a valid request is answered
    within a second, not 503. (A byte sent after the close would make the kernel answer with a reset, which may
    discard the answer before it is read: the clients send no more.)"""
    clients = Access().max_connections
    _more_files(3 * clients + 256)  # the clients' sockets and the server's, in this one process

    def health() -> None:
        assert _request(served, "GET", "/health")[0] == 200

    def generate() -> None:
        status, data = _generate(served, max_new_tokens=4)
        assert status == 200 and data["completion_tokens"] == 4

    generate()
    usual = statistics.median(_timed(generate) for _ in range(3))
    head = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000000\r\n\r\n"
    socks = [_raw(served.port, head, b"{") for _ in range(clients)]
    try:
        health_s = [_timed(health) for _ in range(10)]
        loaded = [_timed(generate) for _ in range(3)]
        closed = 0
        for sock in socks:
            answer, _ = _answer_and_close(sock)
            closed += answer.startswith("HTTP/1.1 200")
    finally:
        for sock in socks:
            sock.close()
    assert closed == clients
    assert max(health_s) < 1.0, health_s
    assert max(loaded) < max(1.0, 2 * usual + 0.25), (usual, loaded)
    print(f"{clients} /health clients with bodies unsent: each answered and closed; /health max "
          f"{max(health_s) * 1e3:.0f} ms, /generate max {max(loaded) * 1e3:.0f} ms (usual {usual * 1e3:.0f} ms)")


@pytest.mark.slow
def test_past_the_connection_limit_a_request_gets_503_counted(tmp_path, context_model_folder):
    limit = 8
    recipe = tiny_recipe(tmp_path, context_model_folder, batch_size=2, page_size=16, dtype="fp32")
    server = Served(recipe, access=Access(api_key=KEY, header_timeout_s=60, max_connections=limit))
    held = []
    try:
        # Connections that have not finished their headers: held until the header deadline.
        held = [_raw(server.port, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n") for _ in range(limit)]
        time.sleep(0.5)
        status, headers, _ = _request(server, "GET", "/health")
        assert status == 503 and headers.get("connection", "").lower() == "close"
    finally:
        for sock in held:
            sock.close()
    try:
        deadline, refused = time.monotonic() + 10, 1
        while (status := _request(server, "GET", "/health")[0]) != 200:
            assert status == 503 and time.monotonic() < deadline, "still refused after the held connections closed"
            refused += 1
            time.sleep(0.1)
        assert _refused(server)["connections"] == refused  # read once the limit lets /metrics through
    finally:
        server.close()
