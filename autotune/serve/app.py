"""Deploy a recipe: rebuild exactly its configuration, warm it up, and serve it over HTTP."""
from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import torch

from autotune.engine import build_engine
from autotune.errors import UserInputError
from autotune.models.registry import resolve_model
from autotune.models.weights import load_hf_model, load_tokenizer, model_checksum
from autotune.progress import log
from autotune.quant.plan import quant_plan
from autotune.recipes.recipe import Recipe
from autotune.serve.http import ServingApp, ServingServer
from autotune.serve.metrics import ServerMetrics
from autotune.serve.protocol import GenerationParams, Limits
from autotune.serve.scheduler import Scheduler

__all__ = ["build_server", "serve_forever"]

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _engine_for(recipe: Recipe, check_weights: bool):
    spec = resolve_model(recipe.model)
    if check_weights and recipe.data["model"]["checksum"] != model_checksum(spec):
        raise UserInputError(f"the weights of {recipe.model} here ({model_checksum(spec)}) are not the ones the "
                             f"recipe was made for ({recipe.data['model']['checksum']}); pass --force to serve anyway")
    config = recipe.config
    if config.device_power:
        torch.set_num_threads(config.device_power)  # on the CPU, the power level is the thread count
    hf = load_hf_model(spec, "float32")
    max_seq_len = min(recipe.max_seq_len, hf.config.max_position_embeddings)
    engine = build_engine(hf, config, plan=quant_plan(hf, spec, load_tokenizer(spec), config, recipe.kept_layers))
    del hf
    return engine, load_tokenizer(spec), max_seq_len


def build_server(recipe: Recipe, host: str = "127.0.0.1", port: int = 8000, max_queue: int = 64,
                 force: bool = False) -> ServingServer:
    """A ready server (engine built and warmed up, scheduler running); call serve_forever() on it."""
    log(f"serve: building {recipe.config.label()} for {recipe.model}")
    engine, tokenizer, max_seq_len = _engine_for(recipe, check_weights=not force)
    scheduler = Scheduler(engine, max_seq_len, max_queue)
    scheduler.start()
    info = {"model": recipe.model, "recipe": str(recipe.path) if recipe.path else None,
            "configuration": recipe.config.to_dict(), "batch_size": recipe.config.batch_size,
            "max_seq_len": max_seq_len, "recipe_verified": recipe.verified,
            "metrics_source": recipe.data["metrics"]["source"]}
    app = ServingApp(scheduler, tokenizer, Limits(max_seq_len), Path(recipe.model).name, info, ServerMetrics())
    _warm_up(app)
    try:
        return ServingServer((host, port), app)
    except OSError as exc:
        scheduler.stop()
        raise UserInputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _warm_up(app: ServingApp) -> None:
    """One short request before accepting any: compiled configurations compile here, not on a user's request."""
    started = time.perf_counter()
    params = GenerationParams(app.encode("Hello")[:8] or [0], 4, 0.0, 1.0, None, ())
    handle = app.scheduler.submit(app.request(params))
    while handle.events.get(timeout=600)[0] == "tokens":
        pass
    log(f"serve: warmed up in {time.perf_counter() - started:.1f} s")


def _raise_interrupt() -> None:
    raise KeyboardInterrupt


def serve_forever(recipe: Recipe, host: str, port: int, max_queue: int, force: bool) -> int:
    if host not in LOOPBACK:
        log(f"serve: listening on {host}, not only loopback: anyone who can reach this machine can use it")
    server = build_server(recipe, host, port, max_queue, force)
    if not recipe.verified:
        log("serve: this recipe is UNVERIFIED (accepted with --force): its figures may not hold")
    print(f"serving {recipe.path} on http://{host}:{server.server_address[1]} "
          f"(POST /generate, POST /v1/completions, GET /health, GET /metrics)", flush=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    # SIGTERM (a process manager stopping us) shuts down as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: _raise_interrupt())
    try:
        while thread.is_alive():
            thread.join(timeout=1.0)
    except KeyboardInterrupt:
        log("serve: shutting down")
    finally:
        server.shutdown()
        server.server_close()
        server.app.scheduler.stop()
    return 0
