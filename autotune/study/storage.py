"""Study storages: an SQLAlchemy URL, SQLite under studies/ by default, PostgreSQL for many workers; errors say
what to fix and never show a password. Heartbeats are on, so that a dead worker's trial is failed and retried."""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import optuna

from autotune.errors import StorageError, UserInputError
from autotune.redact import password_of, redact, scrub

__all__ = ["load_existing_study", "default_storage", "open_storage", "resolve_url", "heartbeat_seconds", "PASSWORD_ENV"]

PASSWORD_ENV = "AUTOTUNE_STORAGE_PASSWORD"
HEARTBEAT_ENV = "AUTOTUNE_HEARTBEAT_S"
CONNECT_TIMEOUT_S = 10


def default_storage(study: str) -> str:
    return f"sqlite:///studies/{study}.db"


def resolve_url(url: str, password_file: str | None = None) -> str:
    """Fill in the password of a URL that names a user but no password: from `password_file` (its first line),
    else from $AUTOTUNE_STORAGE_PASSWORD. The secret then lives only in memory and in the driver."""
    if password_of(url) or "://" not in url or url.startswith("sqlite"):
        if password_file:
            raise UserInputError("--storage-password-file applies to a URL with a user and no password, "
                                 f"like postgresql+psycopg://user@host/db, not {redact(url)}")
        return url
    secret = None
    if password_file:
        try:
            secret = Path(password_file).read_text().splitlines()[0].strip()
        except (OSError, IndexError) as exc:
            raise UserInputError(f"cannot read the storage password from {password_file}: "
                                 f"{getattr(exc, 'strerror', None) or 'empty file'}") from None
    secret = secret or os.environ.get(PASSWORD_ENV) or None
    if secret is None:
        return url
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy's URL parser raises ArgumentError and ValueError
        raise StorageError(f"{redact(url)} is not an SQLAlchemy URL ({type(exc).__name__})") from None
    if parsed.username is None:
        return url
    return parsed.set(password=secret).render_as_string(hide_password=False)


def heartbeat_seconds() -> tuple[int, int]:
    """(interval, grace period): a trial whose worker stayed silent for the grace period is failed and retried."""
    try:
        interval = max(1, int(os.environ.get(HEARTBEAT_ENV, "10")))
    except ValueError:
        raise UserInputError(f"${HEARTBEAT_ENV} must be a whole number of seconds") from None
    return interval, 3 * interval


def _engine_kwargs(url: str) -> dict:
    if url.startswith("sqlite"):
        # Several local workers share one file: wait for the lock rather than fail at once.
        return {"connect_args": {"timeout": 60}}
    if url.startswith("postgresql"):
        # An unreachable host fails in seconds; connections dropped by the server are replaced, not raised.
        return {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}, "pool_pre_ping": True}
    return {}


def open_storage(url: str) -> optuna.storages.BaseStorage:
    if url.startswith("sqlite:///"):
        folder = Path(url.removeprefix("sqlite:///")).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot open study storage {redact(url)}: cannot create {folder} "
                               f"({exc.strerror})") from exc
    interval, grace = heartbeat_seconds()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                url, engine_kwargs=_engine_kwargs(url), heartbeat_interval=interval, grace_period=grace,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1))
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy and drivers raise many types; all mean "cannot open"
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        if "No module named 'psycopg'" in text or "psycopg" in first and "module" in first:
            first = "the PostgreSQL driver is missing: pip install -e '.[pg]'"
        raise StorageError(f"cannot open study storage {redact(url)}: {scrub(first, url)}") from None


def load_existing_study(name: str, url: str | None, password_file: str | None = None) -> tuple[optuna.Study, str]:
    """A study that must exist already; a missing one is a user error that lists what the storage holds."""
    url = resolve_url(url or default_storage(name), password_file)
    storage = open_storage(url)
    try:
        return optuna.load_study(study_name=name, storage=storage), url
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        raise UserInputError(f"no study {name!r} in {redact(url)}; studies there: {names or 'none'}") from None
