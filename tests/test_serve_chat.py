"""POST /v1/chat/completions on a real server: the messages rendered with the tokenizer's chat template (SmolLM2's),
answered as OpenAI's chat completion, streamed or not, and the same tokens as /v1/completions given the rendered
prompt; bad messages refused with their reason."""
from __future__ import annotations

import http.client
import json
from types import SimpleNamespace

import pytest
from recipe_factory import Served, tiny_recipe

from autotune.models.registry import resolve_model
from autotune.models.weights import load_tokenizer
from autotune.serve.api import ServingApp
from autotune.serve.protocol import ApiError

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def served(tmp_path_factory, context_model_folder):
    recipe = tiny_recipe(tmp_path_factory.mktemp("chat"), context_model_folder, batch_size=4, page_size=16,
                         dtype="fp32")
    server = Served(recipe)
    yield server
    server.close()


@pytest.fixture(scope="module")
def tokenizer(context_model_folder):
    return load_tokenizer(resolve_model(str(context_model_folder)))


def _stream(served, path: str, body: dict) -> list[dict]:
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=120)
    conn.request("POST", path, json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("content-type").startswith("text/event-stream")
    events = [line[6:] for line in resp.read().decode().splitlines() if line.startswith("data: ")]
    conn.close()
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_chat_is_the_completion_of_the_rendered_template(served, tokenizer):
    assert tokenizer.chat_template  # SmolLM2's, from its GGUF
    body = {"messages": MESSAGES, "max_tokens": 10, "min_tokens": 10, "temperature": 0}
    status, chat = served.post("/v1/chat/completions", body)
    assert status == 200, chat
    assert chat["object"] == "chat.completion" and chat["id"].startswith("chatcmpl-")
    (choice,) = chat["choices"]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    rendered = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n") and "Name a colour." in rendered
    status, plain = served.post("/v1/completions", {"prompt": rendered, "max_tokens": 10, "min_tokens": 10,
                                                    "temperature": 0})
    assert status == 200
    assert choice["message"]["content"] == plain["choices"][0]["text"]
    prompt_ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert chat["usage"] == {"prompt_tokens": len(prompt_ids), "completion_tokens": 10,
                             "total_tokens": len(prompt_ids) + 10} == plain["usage"]


def test_streamed_chat_equals_the_whole_answer(served):
    body = {"messages": MESSAGES, "max_completion_tokens": 8, "min_tokens": 8, "temperature": 0,
            "stream_options": {"include_usage": True}}
    status, whole = served.post("/v1/chat/completions", body)
    assert status == 200
    events = _stream(served, "/v1/chat/completions", body)
    assert all(e["object"] == "chat.completion.chunk" and e["id"] == events[0]["id"] for e in events)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(e["choices"][0]["delta"].get("role") is None for e in events[1:-1])
    text = "".join(e["choices"][0]["delta"]["content"] for e in events if e["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "length"
    assert events[-1]["choices"] == [] and events[-1]["usage"] == whole["usage"]


@pytest.mark.parametrize("body, words", [
    ({"messages": []}, "at least one message"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "'text'"),
    ({"messages": MESSAGES, "n": 2}, "'n' is not supported"),
    ({"messages": MESSAGES, "tools": [{"type": "function"}]}, "'tools' is not supported"),
    ({"messages": [{"role": "user", "content": "x" * 600_000}]}, "bytes"),
    ({"prompt": "hi"}, "missing field 'messages'"),
])
def test_bad_chat_requests_are_refused_with_their_reason(served, body, words):
    status, data = served.post("/v1/chat/completions", body)
    assert status == 400 and words in data["error"]["message"], data


def test_text_parts_are_joined(served):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Name a "}, {"type": "text", "text": "colour."}]}]
    status, data = served.post("/v1/chat/completions", {"messages": [MESSAGES[0], *parts], "max_tokens": 6,
                                                        "min_tokens": 6, "temperature": 0})
    same = served.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 6, "min_tokens": 6,
                                                "temperature": 0})[1]
    assert status == 200 and data["choices"][0]["message"] == same["choices"][0]["message"]


def test_a_tokenizer_without_a_chat_template_is_refused_in_one_line(tiny_model_folder):
    bare = load_tokenizer(resolve_model(str(tiny_model_folder)))
    bare.chat_template = None
    with pytest.raises(ApiError, match="has no chat template: use /v1/completions"):
        ServingApp.render_chat(SimpleNamespace(tokenizer=bare, model_name="tiny"), MESSAGES)  # type: ignore[arg-type]
