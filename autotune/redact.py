"""Secrets out of sight: a storage URL's password is never printed, logged, stored in a study or a recipe."""
from __future__ import annotations

import re
from urllib.parse import unquote

__all__ = ["redact", "password_of", "scrub"]


def redact(url: str) -> str:
    """The URL with any password replaced, for logs and errors."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def password_of(url: str) -> str | None:
    match = re.search(r"://[^:/@]+:([^@]*)@", url)
    return match.group(1) if match and match.group(1) else None


def scrub(text: str, url: str) -> str:
    """`text` (an error message, a log line) with the URL's password removed, in clear and URL-encoded form."""
    secret = password_of(url)
    if not secret:
        return text
    for form in {secret, unquote(secret)}:
        text = text.replace(form, "***")
    return text
