"""Deploy a recipe: rebuild exactly its configuration on the backend it names, warm it up, and serve it over
HTTP. A simulated recipe was never built anywhere: it is served only as a draft (--draft), said so in the log."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import torch

from autotune.benchmark.peak_rss import rss_bytes, trim_heap
from autotune.config.runtimes import DEFAULT_RUNTIME, runtime_of
from autotune.devices.registry import get_device
from autotune.engine.compiler_cache import compiler_cache_env
from autotune.errors import UserInputError
from autotune.host import num_cores
from autotune.models.registry import resolve_model
from autotune.models.weights import load_hf_model, load_tokenizer, model_checksum
from autotune.openvino.ir_files import SAMPLES, ir_folder
from autotune.openvino.serving import OpenVinoServing
from autotune.progress import log
from autotune.quant.calib_set import calibration_samples
from autotune.quant.plan import quant_plan
from autotune.recipes.recipe import Recipe
from autotune.recipes.target import Placement, place
from autotune.serve.api import ServingApp
from autotune.serve.engine_loop import EngineLoop
from autotune.serve.first_start import check_packaged
from autotune.serve.guard import Access
from autotune.serve.llama_server import serve_with_llama_server
from autotune.serve.metrics import ServerMetrics
from autotune.serve.protocol import Limits, prompt_bytes_for
from autotune.serve.server import ServingServer
from autotune.serve.startup_key import startup_cache

__all__ = ["build_server", "serve_forever", "placement", "engine_for"]

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def placement(recipe: Recipe, draft: bool) -> Placement:
    """Where `recipe` is served here, or a one-line UserInputError: a simulated recipe without `draft`, or a
    measured one whose backend this machine lacks."""
    if recipe.simulated and not draft:
        raise UserInputError(f"{recipe.path} is a simulated recipe (predicted for "
                             f"{recipe.data['hardware'].get('hardware')}, never measured): verify it with "
                             "`autotune verify`, or pass --draft to serve it anyway")
    where = place(recipe)
    if recipe.simulated:
        note = "" if where.comparable else f" instead of {where.target.backend or where.target.hardware} ({where.why})"
        log(f"serve: DRAFT of a simulated recipe for {where.target.hardware}, served on {where.backend}{note}: "
            "its simulated figures do not apply here")
    if recipe.config.device_power and where.threads is None:
        log(f"serve: device_power={recipe.config.device_power} is a level of {where.target.hardware} "
            f"({where.target.power_kind}), not a thread count on {where.backend}: not applied")
    return where


def engine_for(recipe: Recipe, where: Placement, check_weights: bool, packages: Path | None = None):
    """The recipe's engine as the server builds it (threads, quantization plan, fusion level), its tokenizer and the
    context it serves; the fp32 model it was built from is freed. `packages`: where O2's graphs on the CPU are kept
    as AOTInductor packages (engine/startup_cache.py StartupCache.packages)."""
    spec = resolve_model(recipe.model)
    if check_weights and recipe.data["model"]["checksum"] != model_checksum(spec):
        raise UserInputError(f"the weights of {recipe.model} here ({model_checksum(spec)}) are not the ones the "
                             f"recipe was made for ({recipe.data['model']['checksum']}); pass --force to serve anyway")
    config = recipe.config
    runtime = runtime_of(config.runtime)
    if runtime.served_by != "autotune":
        raise UserInputError(f"{recipe.path} is a {runtime.name} recipe: `autotune serve` runs it with "
                             f"{runtime.server}, not with autotune's engine")
    if runtime.name == "openvino":
        return _openvino_for(recipe, spec, where)
    if where.threads:
        torch.set_num_threads(where.threads)
    device = get_device(where.backend)
    hf, tokenizer = load_hf_model(spec, "float32"), load_tokenizer(spec)
    max_seq_len = min(recipe.max_seq_len, hf.config.max_position_embeddings)
    engine = device.build(hf, config,
                          plan=quant_plan(hf, spec, tokenizer, config, recipe.kept_layers), packages=packages)
    del hf
    trim_heap()  # the fp32 model's pages back to the OS, not kept in the heap for the server's lifetime
    return engine, tokenizer, max_seq_len


def _openvino_for(recipe: Recipe, spec, where: Placement) -> tuple[OpenVinoServing, object, int]:
    """The recipe's OpenVINO IR (exported and compressed once, as its trial made it) and the pipeline that serves
    it, with the recipe's threads."""
    config, tokenizer = recipe.config, load_tokenizer(spec)
    samples = calibration_samples(tokenizer, SAMPLES) if config.knobs.reads_calibration() else None
    folder = ir_folder(spec, model_checksum(spec), config.knobs, samples)
    threads = where.threads or config.device_power or num_cores()
    log(f"serve: OpenVINO IR {folder}, {threads} threads")
    return OpenVinoServing(folder, config, threads), tokenizer, recipe.max_seq_len


def build_server(recipe: Recipe, host: str = "127.0.0.1", port: int = 8000, max_queue: int = 64,
                 force: bool = False, draft: bool = False, *, engine_here: bool = False,
                 access: Access | None = None) -> ServingServer:
    """A ready server (engine built and warmed up, port bound: `server.server_address`); start() serves HTTP on a
    thread of its own, stop() ends it. `draft` accepts a simulated recipe (placement()). The engine loop runs on a
    thread of its own, unless `engine_here`: then the caller runs it on this thread, which built the engine
    (`server.app.engine_loop.run()`; autotune/serve/engine_loop.py says why)."""
    where = placement(recipe, draft)
    base_rss = rss_bytes()  # before the weights: what the packaged program's peak memory is counted from
    log(f"serve: building {recipe.config.label()} for {recipe.model} on {where.backend}")
    # This recipe's graphs, compiled by its last start (autotune's engine; OpenVINO compiles its own).
    startup = startup_cache(recipe, where.backend) if recipe.config.runtime == DEFAULT_RUNTIME else None
    if startup is not None:
        # Inductor's kernels are compiled and loaded from the private folder trials use, never from the shared
        # /tmp/torchinductor_$USER that anyone could write to first.
        os.environ.update(compiler_cache_env())
        startup.load()
    engine, tokenizer, max_seq_len = engine_for(recipe, where, check_weights=not force,
                                                packages=startup.packages() if startup else None)
    engine_loop = EngineLoop(engine, max_seq_len, max_queue)
    if engine.packaged is not None:
        # Before any request: the program about to be served is checked against the recipe (serve/first_start.py).
        check_packaged(engine, recipe, tokenizer, engine.packaged.folder, base_rss, force, max_seq_len,
                       warm_up=engine_loop.warm_up)
    started = time.perf_counter()
    if engine_here:
        engine_loop.warm_up()
    else:
        engine_loop.start()
    log(f"serve: warmed up in {time.perf_counter() - started:.1f} s")
    if (difference := recipe.build_difference(engine.build_record)) is not None:
        log(f"serve: {difference}")
    if startup is not None:
        startup.save()
    if engine.packaged is not None:
        startup.report_packages(engine.packaged)
    info = {"model": recipe.model, "recipe": str(recipe.path) if recipe.path else None,
            "configuration": recipe.config.to_dict(), "batch_size": recipe.config.batch_size,
            "max_seq_len": max_seq_len, "recipe_verified": recipe.verified,
            "metrics_source": recipe.data["metrics"]["source"], "backend": where.backend,
            "draft": recipe.simulated, "goodput": _goodput(recipe)}
    limits = Limits(max_seq_len, max_prompt_bytes=prompt_bytes_for(tokenizer, max_seq_len))
    app = ServingApp(engine_loop, tokenizer, limits, Path(recipe.model).name, info,
                     ServerMetrics(engine_loop))
    try:
        return ServingServer((host, port), app, access)
    except OSError as exc:
        engine_loop.stop()
        raise UserInputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _goodput(recipe: Recipe) -> dict | None:
    """What the recipe's study measured this configuration to serve within its latency objectives (autotune search
    --slo), said at the start and in /health; None for a recipe of an offline study."""
    goodput = recipe.data.get("goodput")
    if not goodput:
        return None
    slo = goodput["slo"]
    said = (f"{goodput['goodput_req_s']:.3g} req/s ({goodput['goodput_tok_s']:.1f} output tok/s)" if goodput["met"]
            else "no rate tried met them")
    log(f"serve: measured when searched, within TTFT {slo['ttft_ms']:g} ms and TPOT {slo['tpot_ms']:g} ms for "
        f"{slo['attainment']:.0%} of requests: {said}; `autotune loadtest URL --slo ttft={slo['ttft_ms']:g}ms,"
        f"tpot={slo['tpot_ms']:g}ms --attainment {slo['attainment']:g} --find-goodput` measures it as served")
    return {"slo": slo, "met": goodput["met"], "goodput_req_s": goodput["goodput_req_s"],
            "goodput_tok_s": goodput["goodput_tok_s"]}


def _raise_interrupt() -> None:
    raise KeyboardInterrupt


def serve_forever(recipe: Recipe, host: str, port: int, max_queue: int, force: bool, draft: bool = False,
                  access: Access | None = None, unguarded: bool = False) -> int:
    """Serve `recipe` until interrupted. `unguarded`: a recipe served by another program (llama-server), which has
    none of this server's guard, is served only where the user says so."""
    access = access or Access()
    runtime = runtime_of(recipe.config.runtime)
    if runtime.served_by != "autotune" and not unguarded:
        raise UserInputError(
            f"{recipe.path} is served by {runtime.server}, which has none of autotune serve's guard: no Host "
            "allow-list (a web page can reach it under its own name by DNS rebinding), no JSON-only check (a "
            "cross-site form POST reaches it), no deadlines on a request's headers and body, no connection limit; "
            "only --api-key is passed on. Pass --unguarded to serve it so (on a machine and network you trust), "
            "or serve a recipe of autotune's engine or OpenVINO")
    if host not in LOOPBACK:
        key = "with" if access.api_key else "WITHOUT"
        log(f"serve: listening on {host}, not only loopback, {key} an API key: anyone who can reach this machine "
            f"{'and has the key ' if access.api_key else ''}can use it")
    if runtime.served_by == "llama-server":
        log(f"serve: --unguarded: {runtime.server} answers on {host}:{port} without autotune's guard")
        # llama-cpp-python missing here: refused in one line, as for any backend.
        placement(recipe, draft)
        return serve_with_llama_server(recipe, host, port, force, api_key=access.api_key)
    # One tokenizer call at a time per request: a Rust thread pool of its own would only take CPU from the engine.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    server = build_server(recipe, host, port, max_queue, force, draft, engine_here=True, access=access)
    if not recipe.verified:
        log("serve: this recipe is UNVERIFIED (accepted with --force): its figures may not hold")
    print(f"serving {recipe.path} on http://{host}:{server.server_address[1]} "
          f"(POST /generate, POST /v1/completions, POST /v1/chat/completions, GET /health, GET /metrics)", flush=True)
    # HTTP on an event loop of another thread; the engine stays on this one, which built it.
    server.start()
    # SIGTERM (a process manager stopping us) shuts down as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: _raise_interrupt())
    try:
        server.app.engine_loop.run()
    except KeyboardInterrupt:
        log("serve: shutting down")
    finally:
        server.stop()
    return 0
