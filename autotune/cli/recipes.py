"""The recipe subcommands: `export` (a study's front as recipes), `verify` (re-measure one), `serve` (over HTTP)."""
from __future__ import annotations

import argparse

from autotune.cli.args import positive
from autotune.errors import UserInputError
from autotune.recipes.recipe import holdout_of, load_recipe
from autotune.recipes.signature import read_key
from autotune.recipes.verify import DEFAULT_TOLERANCE, verify
from autotune.results.export import write_recipes
from autotune.results.front import pareto_trials
from autotune.results.tables import study_summary
from autotune.serve import serve_forever
from autotune.serve.guard import API_KEY_ENV, Access
from autotune.study.storage import load_existing_study

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("export", help="write a study's Pareto front as recipes (plus the named picks)")
    e.add_argument("--study", required=True)
    e.add_argument("--storage", default=None, help="SQLAlchemy URL (default: sqlite:///studies/<study>.db)")
    e.add_argument("--out", default="recipes", help="recipes go to OUT/<model>/<hardware>/ (default recipes)")
    e.add_argument("--sign", metavar="KEY", default=None, help="sign the recipes with an HMAC under KEY (env:NAME "
                   "reads it from a variable, @FILE from a file), for serve/verify --require-signature")
    e.set_defaults(func=_export)

    v = sub.add_parser("verify", help="re-measure a recipe here: does it still hold?")
    v.add_argument("recipe")
    v.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                   help=f"allowed worsening of each figure (default {DEFAULT_TOLERANCE})")
    v.add_argument("--repeats", type=positive(int), default=None, help="timed runs (default: the recipe's)")
    v.add_argument("--timeout", type=positive(float), default=1800.0, help="seconds for the rebuild and benchmark")
    v.add_argument("--force", action="store_true", help="accept a recipe that fails its checksum or schema")
    _signature_arg(v)
    v.set_defaults(func=verify)

    s = sub.add_parser("serve", help="serve a recipe over HTTP")
    s.add_argument("recipe")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-queue", type=positive(int), default=64,
                   help="requests that may wait beyond the batch; more get 503 (default 64)")
    s.add_argument("--force", action="store_true", help="accept a recipe that fails its checksum, schema or "
                                                        "weights checksum (served as unverified)")
    s.add_argument("--draft", action="store_true", help="serve a simulated recipe (never measured): on its "
                   "backend when this machine has it, else on the CPU; its figures do not apply")
    s.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a Host name to answer under besides localhost and the bound address (repeatable; '*' any)")
    s.add_argument("--api-key", default=None, help=f"require 'Authorization: Bearer KEY' on every request but "
                   f"/health (default: ${API_KEY_ENV} if set, else no key)")
    s.add_argument("--unguarded", action="store_true",
                   help="serve a llama.cpp recipe by llama-server itself, without autotune's guard (Host allow-list, "
                        "JSON-only bodies, deadlines, connection limit); refused without this flag")
    _signature_arg(s)
    s.set_defaults(func=_serve)


def _signature_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--require-signature", metavar="KEY", default=None,
                        help="refuse a recipe not signed with KEY (autotune export --sign; env:NAME or @FILE)")


def _export(args: argparse.Namespace) -> int:
    study, url = load_existing_study(args.study, args.storage)
    if "model" not in study.user_attrs or "hardware" not in study.user_attrs:
        raise UserInputError(f"study {args.study!r} was not made by autotune search (no model or hardware attributes)")
    print(study_summary(study))
    unchecked = [t.number for t in pareto_trials(study) if holdout_of(study, t) is None]
    if unchecked and study.user_attrs.get("measured", True):
        print(f"note: front trial(s) {', '.join(map(str, unchecked))} have no held-back check (the decode check on "
              "prompts no trial saw): `autotune search` on this study runs it after its trials")
    written = write_recipes(study, args.out, url, key=read_key(args.sign) if args.sign else None)
    if not written:
        raise UserInputError(f"study {args.study!r} has no feasible, gate-passing trial yet: nothing to export")
    for path in written:
        print(f"recipe: {path}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    key = read_key(args.require_signature) if args.require_signature else None
    try:
        access = Access.from_env(tuple(args.allowed_host), args.api_key)
    except ValueError as exc:
        raise UserInputError(f"--api-key: {exc}") from None
    return serve_forever(load_recipe(args.recipe, force=args.force, key=key), args.host, args.port,
                         args.max_queue, args.force, args.draft, access=access, unguarded=args.unguarded)
