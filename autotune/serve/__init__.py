"""Serving a recipe over HTTP: a step-wise scheduler around the engine, and the endpoints in front of it."""
from __future__ import annotations

from autotune.serve.app import build_server, serve_forever
from autotune.serve.scheduler import Overloaded, Scheduler

__all__ = ["build_server", "serve_forever", "Scheduler", "Overloaded"]
