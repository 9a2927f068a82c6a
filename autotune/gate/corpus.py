"""The text shipped with the project (see data/PROVENANCE.md), as token ids: evaluation windows and prompts."""
from __future__ import annotations

import hashlib
import itertools
import random
from pathlib import Path

from autotune.gate.design import (
    DECODE_MAX_PROMPTS,
    DECODE_PROMPT_TOKENS,
    DECODE_STAGE_PROMPTS,
    HOLDOUT_MAX_PROMPTS,
    HOLDOUT_OVERLAP_TOKENS,
)

__all__ = ["DATA", "EVAL_POSITIONS", "eval_windows", "decode_prompts", "decode_set_digest", "bench_prompts",
           "eval_set_digest", "holdout_prompts", "holdout_set_digest"]

DATA = Path(__file__).resolve().parent.parent / "data"
# Positions of the evaluation text every gate is scored on (windows of 512 tokens): the reference, the trials and
# `autotune verify` all use this one figure, so that their gate figures compare.
EVAL_POSITIONS = 4096
EVAL_FILE = DATA / "eval" / "gpl-3.0.txt"
PROMPT_FILES = (DATA / "prompts" / "gfdl-1.3.txt", DATA / "prompts" / "gpl-2.0.txt")
# The held-back set: documents no trial's gate reads, for the one re-check of the recipes a search chose
# (autotune/results/holdout.py). A gate that picks the fastest of many passes favours a lucky pass on its own
# prompts; a figure on prompts that took no part in the choice is not biased that way.
HOLDOUT_FILES = (DATA / "holdout" / "lgpl-2.1.txt", DATA / "holdout" / "gpl-1.0.txt",
                 DATA / "holdout" / "lgpl-3.0.txt")


def _ids(tokenizer, path: Path) -> list[int]:
    return tokenizer(path.read_text(), add_special_tokens=False)["input_ids"]


def eval_windows(tokenizer, min_positions: int = EVAL_POSITIONS, window: int = 512) -> list[list[int]]:
    """Consecutive windows of the evaluation text; each predicts window-1 positions, enough for min_positions.
    The count is rounded up to an even number: the gate prefills windows two at a time."""
    ids = _ids(tokenizer, EVAL_FILE)
    count = -(-min_positions // (window - 1))
    count += count % 2
    if count * window > len(ids):
        raise ValueError(f"the evaluation text has {len(ids)} tokens; {count} windows of {window} need more")
    return [ids[i * window:(i + 1) * window] for i in range(count)]


def decode_prompts(tokenizer, count: int = DECODE_MAX_PROMPTS, length: int = DECODE_PROMPT_TOKENS,
                   eval_positions: int = EVAL_POSITIONS) -> list[list[int]]:
    """Prompts for the decode check: consecutive passages of `length` tokens from three documents (the evaluation
    text past its teacher-forced windows, and the two prompt texts), taken from each document in turn, so that
    every stage of the check (its first prompts, then more) reads all three. At most `count`; fewer where a
    tokenizer makes the texts shorter, never fewer than one stage."""
    skip = len(eval_windows(tokenizer, eval_positions)) * 512
    documents = [_ids(tokenizer, EVAL_FILE)[skip:], *(_ids(tokenizer, path) for path in PROMPT_FILES)]
    prompts = _interleaved(documents, length)[:count]
    if len(prompts) < min(count, DECODE_STAGE_PROMPTS):
        raise ValueError(f"the shipped texts give {len(prompts)} passages of {length} tokens with this tokenizer; "
                         f"the decode check needs {min(count, DECODE_STAGE_PROMPTS)}")
    return prompts


def holdout_prompts(tokenizer, count: int = HOLDOUT_MAX_PROMPTS, length: int = DECODE_PROMPT_TOKENS) -> list[list[int]]:
    """The held-back prompts: passages of the held-back documents, taken in turn as the decode prompts are, less
    any that shares HOLDOUT_OVERLAP_TOKENS consecutive tokens with the gate's texts (the licences repeat each
    other's warranty clauses: such a passage would not be unseen)."""
    span = HOLDOUT_OVERLAP_TOKENS
    gate_texts = (_ids(tokenizer, EVAL_FILE), *(_ids(tokenizer, path) for path in PROMPT_FILES))
    seen = {tuple(doc[i:i + span]) for doc in gate_texts for i in range(len(doc) - span + 1)}
    fresh = [p for p in _interleaved([_ids(tokenizer, path) for path in HOLDOUT_FILES], length)
             if not any(tuple(p[i:i + span]) in seen for i in range(length - span + 1))]
    if len(fresh) < min(count, DECODE_STAGE_PROMPTS):
        raise ValueError(f"the held-back texts give {len(fresh)} unseen passages of {length} tokens with this "
                         f"tokenizer; the held-back check needs {min(count, DECODE_STAGE_PROMPTS)}")
    return fresh[:count]


def _interleaved(documents: list[list[int]], length: int) -> list[list[int]]:
    """Consecutive passages of `length` tokens of each document, one document after the other in turn."""
    passages = [[doc[i:i + length] for i in range(0, len(doc) - length + 1, length)] for doc in documents]
    return [p for group in itertools.zip_longest(*passages) for p in group if p is not None]


def decode_set_digest() -> str:
    """What decides the decode prompts' text (their sizes are the gate design's, keyed apart)."""
    return _files_digest((EVAL_FILE, *PROMPT_FILES))


def holdout_set_digest() -> str:
    """What decides the held-back prompts: their texts and the texts they must not overlap."""
    return _files_digest((*HOLDOUT_FILES, EVAL_FILE, *PROMPT_FILES))


def _files_digest(paths: tuple[Path, ...]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def eval_set_digest(min_positions: int, window: int = 512) -> str:
    return hashlib.sha256(EVAL_FILE.read_bytes() + f"{min_positions}/{window}/even".encode()).hexdigest()[:16]


def bench_prompts(tokenizer, count: int, min_tokens: int, max_tokens: int, seed: int = 0) -> list[list[int]]:
    """`count` prompts of real text, lengths drawn uniformly from [min_tokens, max_tokens]."""
    ids = [t for path in PROMPT_FILES for t in _ids(tokenizer, path)]
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        length = rng.randint(min_tokens, max_tokens)
        start = rng.randrange(0, len(ids) - length)
        prompts.append(ids[start:start + length])
    return prompts
