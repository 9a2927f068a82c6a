"""The recipe subcommands (export, verify, serve, loadtest): their arguments and their dispatch."""
from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["COMMANDS", "add_parsers", "run_command"]

COMMANDS = ("export", "verify", "serve", "loadtest")


def add_parsers(sub: argparse._SubParsersAction, positive: Callable, token_range: Callable) -> None:
    e = sub.add_parser("export", help="write a study's Pareto front as recipes (plus the named picks)")
    e.add_argument("--study", required=True)
    e.add_argument("--storage", default=None, help="SQLAlchemy URL (default: sqlite:///studies/<study>.db)")
    e.add_argument("--out", default="recipes", help="recipes go to OUT/<model>/<hardware>/ (default recipes)")

    v = sub.add_parser("verify", help="re-measure a recipe here: does it still hold?")
    v.add_argument("recipe")
    v.add_argument("--tolerance", type=float, default=0.10, help="allowed worsening of each figure (default 0.10)")
    v.add_argument("--repeats", type=positive(int), default=None, help="timed runs (default: the recipe's)")
    v.add_argument("--timeout", type=positive(float), default=1800.0, help="seconds for the rebuild and benchmark")
    v.add_argument("--force", action="store_true", help="accept a recipe that fails its checksum or schema")

    s = sub.add_parser("serve", help="serve a recipe over HTTP")
    s.add_argument("recipe")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-queue", type=positive(int), default=64,
                   help="requests that may wait beyond the batch; more get 503 (default 64)")
    s.add_argument("--force", action="store_true", help="accept a recipe that fails its checksum, schema or "
                                                        "weights checksum (served as unverified)")

    lt = sub.add_parser("loadtest", help="client-side load test of a server (ours or OpenAI-compatible)")
    lt.add_argument("url", help="http://127.0.0.1:PORT (loopback only)")
    lt.add_argument("--concurrency", default="1,4,8,16,32", help="comma-separated levels (default 1,4,8,16,32)")
    lt.add_argument("--requests", type=positive(int), default=None,
                    help="requests per level (default max(16, 2 x concurrency))")
    lt.add_argument("--rate", type=positive(float), default=None, help="requests/s (Poisson); default all at once")
    lt.add_argument("--max-tokens", type=positive(int), default=64, help="output tokens per request (default 64)")
    lt.add_argument("--prompt-tokens", type=token_range, default=(112, 144), help="MIN:MAX prompt tokens")
    lt.add_argument("--tokenizer", default="smollm2-135m", help="model whose tokenizer cuts the prompts")
    lt.add_argument("--model-id", default=None, help="model field sent (default: the server's GET /v1/models)")
    lt.add_argument("--no-fixed-length", action="store_true",
                    help="do not send min_tokens/ignore_eos (servers that refuse vLLM's extensions)")
    lt.add_argument("--json", default=None, help="write the results here as JSON")


def run_command(args: argparse.Namespace) -> int:
    if args.command == "export":
        from autotune.export_cmd import export

        return export(args)
    if args.command == "verify":
        from autotune.verify import verify

        return verify(args)
    if args.command == "serve":
        from autotune.recipe import load_recipe
        from autotune.serve import serve_forever

        return serve_forever(load_recipe(args.recipe, force=args.force), args.host, args.port, args.max_queue,
                             args.force)
    from autotune.loadtest_cmd import loadtest

    return loadtest(args)
