"""`autotune models`: the model registry."""
from __future__ import annotations

import argparse

from autotune.models.registry import REGISTRY

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("models", help="the model registry").set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    print(f"{'name':<14} {'layers':>6} {'hidden':>6} {'heads':>5} {'kv':>3} {'ffn':>6} {'vocab':>7} {'params':>7}  source")
    for spec in REGISTRY.values():
        print(f"{spec.name:<14} {spec.num_layers:>6} {spec.hidden_size:>6} {spec.num_heads:>5} "
              f"{spec.num_kv_heads:>3} {spec.intermediate_size:>6} {spec.vocab_size:>7} "
              f"{spec.num_params / 1e9:>6.2f}B  {spec.source}")
    print("or any local Hugging Face folder with a config.json")
    return 0
