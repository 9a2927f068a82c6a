"""`autotune worker`: join a study that `autotune search` started and run its trials until its budget is spent."""
from __future__ import annotations

import argparse

from autotune.study.workers import join_study

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    w = sub.add_parser("worker", help="join a study started by `autotune search` and run its trials")
    w.add_argument("--study", required=True)
    w.add_argument("--storage", required=True, help="the study's SQLAlchemy URL (PostgreSQL for many machines)")
    w.add_argument("--storage-password-file", default=None,
                   help="file whose first line is the storage password (else $AUTOTUNE_STORAGE_PASSWORD)")
    w.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)  # set by search --workers
    w.set_defaults(func=_run, interruptible=True)


def _run(args: argparse.Namespace) -> int:
    join_study(args.study, args.storage, args.storage_password_file, args.worker_index)
    return 0
