"""On-disk caches keyed by what decides their content: the reference per model, evaluation set and gate design,
and gate figures per model, evaluation set, numerics, verdict settings and calibration. Each key is the digest of
a dict of its inputs (`gate_inputs`, `reference_inputs`), built in one place for the study's process and for the
trial's child, and the design's and the calibration's figures enter by module (autotune/gate/design.py,
autotune/config/calibration.py), so that a figure added there is keyed without touching this file."""
from __future__ import annotations

import hashlib
import json
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from autotune.code_hash import code_hash
from autotune.config.calibration import calibration_inputs, needs_plan
from autotune.config.deploy import DeployConfig
from autotune.gate.corpus import decode_set_digest, holdout_set_digest
from autotune.gate.design import design
from autotune.host import ISA_FLAGS, cpu_flags, cpu_model, cpu_signature, isa_caps, isa_level
from autotune.paths import cache_root

__all__ = ["gate_inputs", "gate_key", "numerics_versions", "host_numerics", "load_gate", "store_gate",
           "reference_inputs",
           "reference_path"]


def numerics_versions() -> dict[str, str]:
    """The software whose kernels decide a build's numbers: autotune's build code by its digest (code_hash.py), the
    libraries by package metadata, so that the study's process and the trial's child compute the same key without
    importing torch."""
    out = {"engine": code_hash()}
    for package in ("torch", "torchao", "transformers"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "absent"
    return out


def host_numerics() -> dict:
    """This CPU as far as it decides a build's rounding: its model and family/model, the ISA flags it has (of those
    that pick kernels, host.ISA_FLAGS), and the
    level torch's kernels run at under the caps set (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY): emulated and native
    bf16 round differently, so a verdict made under a cap is not one made without it."""
    flags = cpu_flags()
    return {"cpu": cpu_model(), "signature": cpu_signature(), "flags": sorted(flags & set(ISA_FLAGS)),
            "isa_level": isa_level(flags),
            "isa_caps": isa_caps()}


def _digest(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:20]


def reference_inputs(model_checksum: str, eval_digest: str) -> dict:
    """What the reference's content depends on: the model, the evaluation windows' text and count, the decode
    prompts' text, the gate design (prompt count and length, tokens generated, top-K), and the software that
    computes it (transformers' model code in fp32, on torch's kernels)."""
    versions = numerics_versions()
    return {"model": model_checksum, "eval": eval_digest, "decode_text": decode_set_digest(), "design": design(),
            "transformers": versions["transformers"], "torch": versions["torch"]}


def reference_path(model_checksum: str, eval_digest: str) -> Path:
    key = _digest(reference_inputs(model_checksum, eval_digest))
    return cache_root() / "reference" / f"{model_checksum.removeprefix('sha256:')[:16]}-{key}.pt"


def holdout_reference_path(model_checksum: str) -> Path:
    """The reference's continuations of the held-back prompts: keyed as the reference is, by their own texts."""
    versions = numerics_versions()
    key = _digest({"model": model_checksum, "holdout_text": holdout_set_digest(), "design": design(),
                   "transformers": versions["transformers"], "torch": versions["torch"]})
    return cache_root() / "reference" / f"{model_checksum.removeprefix('sha256:')[:16]}-holdout-{key}.pt"


def gate_inputs(model_checksum: str, eval_digest: str, config: DeployConfig, *, tie_epsilon: float,
                min_agreement: float, device: str, threads: int, kept_layers: tuple[str, ...] | None = None,
                versions: dict | None = None) -> dict:
    """Everything that changes a gate's figures or its verdict: the reference's inputs, the numerics, the verdict's
    settings (the staged stop depends on min_agreement), the device (another device's kernels) and the CPU it runs
    on (host_numerics), the thread count
    (how a reduction is split), the versions of the engine and of the libraries whose kernels it runs (`versions`
    where the runtime is not torch's: llama.cpp's build), and for a calibrated build every figure of its calibration
    and the layers it keeps when they are given rather than ranked."""
    return {"reference": reference_inputs(model_checksum, eval_digest), "numerics": config.numerics_key(),
            "tie_epsilon": tie_epsilon, "min_agreement": min_agreement, "device": device, "host": host_numerics(),
            "threads": threads,
            "versions": numerics_versions() if versions is None else versions,
            "calibration": calibration_inputs() if needs_plan(config) else None,
            "kept_layers": list(kept_layers) if kept_layers is not None else None}


def gate_key(inputs: dict) -> str:
    return _digest(inputs)


def _gate_path(key: str) -> Path:
    return cache_root() / "gates" / f"{key}.json"


def load_gate(key: str) -> dict | None:
    try:
        return json.loads(_gate_path(key).read_text())
    except (OSError, ValueError):
        return None


def store_gate(key: str, figures: dict) -> None:
    path = _gate_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(figures, indent=1))
    tmp.replace(path)  # atomic: concurrent workers never read half a file
