"""Study storages: an SQLAlchemy URL, SQLite under studies/ by default; errors say what to fix."""
from __future__ import annotations

import re
from pathlib import Path

import optuna

from autotune.errors import StorageError

__all__ = ["default_storage", "open_storage", "redact"]


def default_storage(study: str) -> str:
    return f"sqlite:///studies/{study}.db"


def redact(url: str) -> str:
    """The URL with any password replaced, for logs and errors."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def open_storage(url: str) -> optuna.storages.BaseStorage:
    if url.startswith("sqlite:///"):
        folder = Path(url.removeprefix("sqlite:///")).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot open study storage {redact(url)}: cannot create {folder} "
                               f"({exc.strerror})") from exc
    try:
        return optuna.storages.RDBStorage(url, heartbeat_interval=None)
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy and drivers raise many types; all mean "cannot open"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StorageError(f"cannot open study storage {redact(url)}: {first}") from exc
