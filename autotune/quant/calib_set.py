"""The calibration set: 512 samples of shipped real text, kept apart from the evaluation text (data/PROVENANCE.md).

A sample is a run of SAMPLE_TOKENS consecutive tokens of one calibration document; starts are spread evenly over
each document, documents get samples in proportion to their length. There are fewer distinct tokens (~14,500)
than 512 x 64, so neighbouring samples overlap by about half: the same text seen at other positions. The
documents are other licences than the evaluation text's, and no sample shares DISJOINT_RUN consecutive tokens with
the evaluation text (licences share a few boilerplate sentences: windows over them are skipped)."""
from __future__ import annotations

import hashlib
import json
from functools import cache
from itertools import accumulate

from autotune.config.calibration import CALIB_FILES, DISJOINT_RUN, NUM_SAMPLES, SAMPLE_TOKENS
from autotune.gate.corpus import EVAL_FILE

__all__ = [
    "calib_set_digest",
    "calibration_samples",
    "provenance",
    "shared_run",
]


def _documents(tokenizer) -> list[list[int]]:
    return [tokenizer(path.read_text(), add_special_tokens=False)["input_ids"] for path in CALIB_FILES]


def _allowed_starts(doc: list[int], length: int, runs: set[tuple[int, ...]]) -> list[int]:
    """Starts of windows of `doc` that share no DISJOINT_RUN-token run with the evaluation text (`runs`)."""
    shared = [int(tuple(doc[i:i + DISJOINT_RUN]) in runs) for i in range(max(len(doc) - DISJOINT_RUN + 1, 0))]
    prefix = [0, *accumulate(shared)]
    last = length - DISJOINT_RUN  # the last run inside a window starts here, relative to the window
    return [s for s in range(len(doc) - length + 1) if prefix[s + last + 1] - prefix[s] == 0]


def _spread(docs: list[list[int]], num_samples: int, length: int, avoid: list[int]) -> list[list[int]]:
    runs = {tuple(avoid[i:i + DISJOINT_RUN]) for i in range(len(avoid) - DISJOINT_RUN + 1)}
    starts = [_allowed_starts(d, length, runs) for d in docs]
    room = [len(s) for s in starts]
    total = sum(room)
    # Largest remainder: each document's share of the samples by the starts it offers.
    shares = [num_samples * r / total for r in room]
    counts = [int(s) for s in shares]
    for i in sorted(range(len(docs)), key=lambda i: counts[i] - shares[i])[:num_samples - sum(counts)]:
        counts[i] += 1
    samples = []
    for doc, allowed, n in zip(docs, starts, counts):
        for k in range(n):
            start = allowed[round(k * (len(allowed) - 1) / max(n - 1, 1))]
            samples.append(doc[start:start + length])
    return samples


def calibration_samples(tokenizer, num_samples: int = NUM_SAMPLES, length: int = SAMPLE_TOKENS) -> list[list[int]]:
    """`num_samples` token-id lists of `length` each, the same for a tokenizer every time."""
    avoid = tokenizer(EVAL_FILE.read_text(), add_special_tokens=False)["input_ids"]
    return _spread(_documents(tokenizer), num_samples, length, avoid)


@cache
def calib_set_digest(num_samples: int = NUM_SAMPLES, length: int = SAMPLE_TOKENS) -> str:
    """What decides the samples (the files' bytes and the sampling): part of every calibration cache key."""
    digest = hashlib.sha256()
    for path in (*CALIB_FILES, EVAL_FILE):
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(f"{num_samples}x{length}/spread/disjoint{DISJOINT_RUN}".encode())
    return digest.hexdigest()[:16]


def provenance(samples: list[list[int]], used_for: str = "statistics, AWQ scales and sensitivity") -> dict:
    """What a trial and a recipe record about the calibration samples it drew: their count, length and digest, as
    drawn (not as configured), and the files they were drawn from."""
    drawn = hashlib.sha256(json.dumps(samples).encode()).hexdigest()[:16]
    return {"files": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in CALIB_FILES},
            "samples": len(samples), "sample_tokens": len(samples[0]) if samples else 0, "drawn_digest": drawn,
            "used_for": used_for, "set_digest": calib_set_digest(),
            "source": "autotune/data/calib (license texts from Debian base-files; see autotune/data/PROVENANCE.md)",
            "disjoint": f"other documents than the evaluation text ({EVAL_FILE.name}); no sample shares "
                        f"{DISJOINT_RUN} consecutive tokens with it"}


def shared_run(samples: list[list[int]], other: list[int], length: int) -> list[int]:
    """Indices of samples that share a run of `length` consecutive tokens with `other` (the disjointness check)."""
    runs = {tuple(other[i:i + length]) for i in range(len(other) - length + 1)}
    return [k for k, s in enumerate(samples)
            if any(tuple(s[i:i + length]) in runs for i in range(len(s) - length + 1))]
