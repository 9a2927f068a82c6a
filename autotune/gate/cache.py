"""On-disk caches keyed by what decides their content: the reference per model and evaluation set, and gate
figures per model, evaluation set and numerics knobs (shared by every trial and worker on this machine)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from autotune.paths import cache_root

__all__ = ["gate_key", "load_gate", "store_gate", "reference_path"]


def gate_key(model_checksum: str, eval_digest: str, numerics_key: str, tie_epsilon: float, device: str) -> str:
    """The device is part of the key: another device's kernels compute other numerics for the same knobs."""
    text = json.dumps([model_checksum, eval_digest, numerics_key, tie_epsilon, device])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _gate_path(key: str) -> Path:
    return cache_root() / "gates" / f"{key}.json"


def load_gate(key: str) -> dict | None:
    try:
        return json.loads(_gate_path(key).read_text())
    except (OSError, ValueError):
        return None


def store_gate(key: str, figures: dict) -> None:
    path = _gate_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(figures, indent=1))
    tmp.replace(path)  # atomic: concurrent workers never read half a file


def reference_path(model_checksum: str, eval_digest: str) -> Path:
    return cache_root() / "reference" / f"{model_checksum.removeprefix('sha256:')[:16]}-{eval_digest}.pt"
