"""`autotune models`: the model registry and the architectures the engine builds."""
from __future__ import annotations

import argparse

from autotune.models.architectures import ARCHITECTURES, ROPE_TYPES
from autotune.models.registry import REGISTRY, REGISTRY_PATH

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("models", help="the model registry and the supported architectures").set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    print(f"{'name':<14} {'arch':<12} {'layers':>6} {'hidden':>6} {'heads':>5} {'kv':>3} {'ffn':>6} {'vocab':>7} "
          f"{'window':>7} {'params':>7}  source")
    for spec in REGISTRY.values():
        window = f"{spec.sliding_window}x{spec.num_sliding_layers}" if spec.num_sliding_layers else "-"
        print(f"{spec.name:<14} {spec.architecture:<12} {spec.num_layers:>6} {spec.hidden_size:>6} "
              f"{spec.num_heads:>5} {spec.num_kv_heads:>3} {spec.intermediate_size:>6} {spec.vocab_size:>7} "
              f"{window:>7} {spec.num_params / 1e9:>6.2f}B  {spec.source}")
    print(f"(the registry: {REGISTRY_PATH}; window: sliding window x windowed layers)")
    print("\nsupported architectures (transformers model_type: family), built from the model's own config:")
    for arch in ARCHITECTURES.values():
        print(f"  {arch.model_type:<12} {arch.family}")
    print(f"  rope scaling: {', '.join(ROPE_TYPES)}; any other architecture or feature is refused before a trial")
    print("\n--model also takes a local Hugging Face folder (with a config.json) or a Hub id (org/name): from the "
          "local Hub cache with HF_HUB_OFFLINE=1 (the default), downloaded with HF_HUB_OFFLINE=0")
    return 0
