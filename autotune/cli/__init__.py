"""The command line: `main` builds one parser from each command group's `register(subparsers)`."""
from __future__ import annotations

from autotune.cli.main import main

__all__ = ["main"]
