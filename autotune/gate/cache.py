"""On-disk caches keyed by what decides their content: the reference per model and evaluation set, and gate
figures per model, evaluation set and numerics knobs (shared by every trial and worker on this machine)."""
from __future__ import annotations

import hashlib
import json
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from autotune import ENGINE_VERSION
from autotune.paths import cache_root

__all__ = ["gate_key", "numerics_versions", "load_gate", "store_gate", "reference_path"]

# Bump when the reference's content changes (what is stored, how it is computed).
REFERENCE_VERSION = "2"


def numerics_versions() -> dict[str, str]:
    """The software whose kernels decide a build's numbers: read from package metadata, so that the study's process
    and the trial's child compute the same key without importing torch."""
    out = {"engine": ENGINE_VERSION}
    for package in ("torch", "torchao", "transformers"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "absent"
    return out


def gate_key(model_checksum: str, eval_digest: str, numerics_key: str, tie_epsilon: float, device: str,
             threads: int) -> str:
    """Everything that changes a gate's figures: the device (another device's kernels), the thread count (how a
    reduction is split), and the versions of the engine and of the libraries whose kernels it runs."""
    text = json.dumps([model_checksum, eval_digest, numerics_key, tie_epsilon, device, threads,
                       sorted(numerics_versions().items())])
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
    name = f"{model_checksum.removeprefix('sha256:')[:16]}-{eval_digest}-v{REFERENCE_VERSION}.pt"
    return cache_root() / "reference" / name
