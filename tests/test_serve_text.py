"""Streamed text: the pieces add up to what the tokenizer decodes, a possible stop string is held back until the
next tokens decide it, and the cost of a token does not grow with the length of the stream."""
from __future__ import annotations

import time

import pytest
from transformers import AutoTokenizer

from autotune.gate.corpus import PROMPT_FILES
from autotune.serve.text import TextStream


@pytest.fixture(scope="module")
def tok(smollm2_folder):
    return AutoTokenizer.from_pretrained(smollm2_folder)


def _stream(tok, text: str, stop: tuple[str, ...] = (), per_step: int = 1) -> tuple[list[str], TextStream]:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    stream = TextStream(tok, stop)
    deltas = [stream.add(ids[i:i + per_step]) for i in range(0, len(ids), per_step)]
    return deltas + [stream.finish()], stream


@pytest.mark.parametrize("per_step", [1, 3])
def test_pieces_add_up_to_the_decoded_text_multibyte_included(tok, per_step):
    text = "Voilà: 日本語のテキスト, emoji 🙂🚀 and ﬁ ligatures — «quoted» ünïcödé.\n\nEnd."
    deltas, stream = _stream(tok, text, per_step=per_step)
    assert "".join(deltas) == stream.text == text
    assert not any("\ufffd" in d for d in deltas)  # half a UTF-8 sequence never goes out


def test_an_unfinished_utf8_sequence_at_the_end_comes_out_as_the_tokenizer_decodes_it(tok):
    ids = tok("日本", add_special_tokens=False)["input_ids"]
    byte_tokens = [i for i in ids if tok.decode([i]).endswith("\ufffd")]
    assert byte_tokens, "expected a token that is part of a UTF-8 sequence"
    stream = TextStream(tok, ())
    cut = ids[:ids.index(byte_tokens[0]) + 1]
    out = stream.add(cut) + stream.finish()
    assert out == tok.decode(cut, skip_special_tokens=True)


def _may_begin(known: str, p: int, stop: str) -> bool:
    """Whether a stop string may begin at `p` of the text known so far (what follows is not known yet)."""
    tail = known[p:]
    return stop.startswith(tail) if len(tail) < len(stop) else tail.startswith(stop)


def test_a_possible_stop_string_is_held_back_until_the_next_tokens_decide_it(tok):
    text = "The end is not the ending: the endgame ends here."
    stop = "endgame"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    stream, emitted = TextStream(tok, (stop,)), ""
    for n in range(len(ids)):
        emitted += stream.add(ids[n:n + 1])
        known = tok.decode(ids[:n + 1])
        # Out goes exactly the text before the first place a stop string may still begin: "end" (twice) waited
        # for the token after it.
        held = next((p for p in range(len(known)) if _may_begin(known, p, stop)), len(known))
        assert emitted == known[:held], (known, emitted)
    emitted += stream.finish()
    assert stream.stopped and stream.text == emitted == "The end is not the ending: the "
    # Without stop strings nothing is held: every token's text goes out with it.
    plain, _ = _stream(tok, text)
    assert all(plain[:-1]) and plain[-1] == ""


def _stream_times(tok, ids: list[int], stop: tuple[str, ...]) -> list[float]:
    stream = TextStream(tok, stop)
    times = []
    for i in ids:
        started = time.perf_counter()
        stream.add([i])
        times.append(time.perf_counter() - started)
    return times


def test_decoding_a_2000_token_stream_costs_linear_time(tok):
    # Re-decoding every id so far on every token (the old TextStream) made the last 500 tokens of this stream ~7x
    # the cost of the first 500; one decode step per token keeps them alike. The fastest of 5 runs of each quarter
    # stands against the load of a shared machine.
    ids = tok(PROMPT_FILES[1].read_text(), add_special_tokens=False)["input_ids"][:2000]
    assert len(ids) == 2000
    runs = [_stream_times(tok, ids, stop=("\n\n\n\n", "THE END")) for _ in range(5)]
    first = min(sum(r[:500]) for r in runs)
    last = min(sum(r[-500:]) for r in runs)
    assert last < 3 * first, (first, last)
