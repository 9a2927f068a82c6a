"""Signed recipes: an HMAC-SHA256 of the recipe's content under a key its maker and its server share. The
checksum a recipe carries shows corruption, not who made it (anyone can compute a sha256); the signature does.
Signing is optional: unsigned recipes load as before, and a signed one loads without a key too; only a caller that
requires a signature (`serve`/`verify --require-signature KEY`) refuses an unsigned or wrongly signed one."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path

from autotune.errors import UserInputError

__all__ = ["ALGORITHM", "canonical_json", "content_of", "sign", "signature_problem", "read_key"]

ALGORITHM = "hmac-sha256"
# Not signed or checksummed: the checksum and the signature themselves.
_SEALS = ("checksum", "signature")


def canonical_json(content: dict) -> bytes:
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def content_of(data: dict) -> dict:
    """The recipe without its seals: what the checksum and the signature are computed over."""
    return {k: v for k, v in data.items() if k not in _SEALS}


def _mac(data: dict, key: bytes) -> str:
    return hmac.new(key, canonical_json(content_of(data)), hashlib.sha256).hexdigest()


def sign(data: dict, key: bytes) -> dict:
    """`data` with its signature (any earlier one replaced)."""
    return {**data, "signature": {"algorithm": ALGORITHM, "value": _mac(data, key)}}


def signature_problem(data: dict, key: bytes) -> str | None:
    """Why `data` is not signed by `key` (one line), or None when it is."""
    signature = data.get("signature")
    if not isinstance(signature, dict):
        return "it is not signed (export it with `autotune export --sign KEY`)"
    if signature.get("algorithm") != ALGORITHM:
        return f"its signature is {signature.get('algorithm')!r}, not {ALGORITHM}"
    # As bytes: compare_digest refuses a str with non-ASCII characters (TypeError), which an edited file may hold.
    if not hmac.compare_digest(str(signature.get("value", "")).encode(), _mac(data, key).encode()):
        return "its signature does not match (signed with another key, or edited after it was signed)"
    return None


def read_key(text: str) -> bytes:
    """A key as given on the command line: `env:NAME` reads the variable NAME, `@PATH` the file PATH (both keep
    the key out of the process list), anything else is the key itself."""
    if text.startswith("env:"):
        value = os.environ.get(text.removeprefix("env:"), "")
        where = f"the environment variable {text.removeprefix('env:')}"
    elif text.startswith("@"):
        try:
            value = Path(text[1:]).read_text().strip()
        except OSError as exc:
            raise UserInputError(f"cannot read the key file {text[1:]}: {exc.strerror or exc}") from None
        where = f"the key file {text[1:]}"
    else:
        value, where = text, "the key given"
    if len(value) < 16:
        raise UserInputError(f"{where} is {'empty' if not value else 'shorter than 16 characters'}: a signing key "
                             "needs at least 16 (e.g. `openssl rand -hex 32`)")
    return value.encode()
