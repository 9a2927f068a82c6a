"""Serving a recipe over HTTP: the engine loop (one thread steps the engine), and the FastAPI endpoints in front
of it on uvicorn."""
from __future__ import annotations

from autotune.serve.app import build_server, serve_forever
from autotune.serve.engine_loop import EngineLoop, Overloaded
from autotune.serve.server import ServingServer

__all__ = ["build_server", "serve_forever", "EngineLoop", "Overloaded", "ServingServer"]
