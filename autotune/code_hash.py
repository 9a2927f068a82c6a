"""A digest of the code that builds a model and decides its numbers (the engine, its quantizers, the model
architectures): what a cached gate verdict, a probe's figures and a saved compiled program were made by. It
replaces a hand-bumped version number, which stayed the same through changes that altered the figures."""
from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

__all__ = ["BUILD_CODE", "code_hash"]

_ROOT = Path(__file__).resolve().parent
# The packages whose source a build runs: a change in any of them may change what a build computes.
BUILD_CODE = ("engine", "quant", "models")


@cache
def code_hash(packages: tuple[str, ...] = BUILD_CODE) -> str:
    """sha256 of each package's files (.py and the data files they read, .yaml), by relative path, 16 hex digits."""
    digest = hashlib.sha256()
    for package in packages:
        for path in sorted(p for p in (_ROOT / package).rglob("*") if p.suffix in (".py", ".yaml")):
            digest.update(str(path.relative_to(_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
