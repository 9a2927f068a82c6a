"""The model as OpenVINO IR folders, one per weight format: the fp32 export made once per model by optimum-intel in the
export environment (autotune/openvino/export_env.py), every other format derived from it once with OpenVINO and
NNCF, each cached by the weights' checksum, the export environment's versions and the format's own knobs."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from autotune.config.openvino_knobs import OpenVinoKnobs
from autotune.errors import TrialFailure
from autotune.models.registry import ModelSpec
from autotune.models.weights import weights_folder
from autotune.openvino.export_env import TOOL, export_python, export_requirements
from autotune.paths import cache_root
from autotune.progress import log

__all__ = ["ir_folder", "format_key", "SAMPLES"]

# Calibration samples NNCF's data-aware int4 methods read (its own default subset size).
SAMPLES = 128


def format_key(knobs: OpenVinoKnobs, calib_digest: str | None = None) -> str:
    """The folder name of a weight format: "fp16", "int4-awq-g64-r0.8-c<digest>"."""
    if knobs.weight_format != "int4":
        return knobs.weight_format
    key = f"int4-{knobs.int4_method}-g{knobs.group_size}-r{knobs.ratio:g}"
    return key + (f"-c{calib_digest}" if knobs.reads_calibration() else "")


def _root(checksum: str) -> Path:
    versions = hashlib.sha256("\n".join(export_requirements()).encode()).hexdigest()[:8]
    return cache_root() / "openvino" / "ir" / f"{checksum.removeprefix('sha256:')[:16]}-{versions}"


def _run_tool(args: list[str], what: str) -> None:
    started = time.perf_counter()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    ran = subprocess.run([str(export_python()), str(TOOL), *args], env=env, capture_output=True, text=True)
    if ran.returncode != 0:
        tail = "\n".join((ran.stdout + ran.stderr).strip().splitlines()[-8:])
        raise TrialFailure(f"OpenVINO {what} failed (exit {ran.returncode}):\n{tail}")
    log(f"  openvino: {what} in {time.perf_counter() - started:.0f} s")


def _made(out: Path, make) -> Path:
    """`out`, made by `make(tmp)` into a scratch folder beside it and renamed whole: a concurrent trial never reads
    half an IR."""
    if (out / "openvino_model.xml").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        make(tmp)
        try:
            tmp.rename(out)
        except OSError:  # made meanwhile by another process
            if not (out / "openvino_model.xml").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def ir_folder(spec: ModelSpec, checksum: str, knobs: OpenVinoKnobs, samples: list[list[int]] | None = None) -> Path:
    """The IR folder of the configuration's weight format, made on first use. `samples`: the calibration token ids
    (for the data-aware int4 methods; their digest keys the folder)."""
    root = _root(checksum)
    base = _made(root / "fp32", lambda tmp: _run_tool(["export", str(weights_folder(spec)), str(tmp)],
                                                     f"export of {spec.name} to IR (fp32, once)"))
    if knobs.weight_format == "fp32":
        return base
    if knobs.reads_calibration() and not samples:
        raise TrialFailure(f"{knobs.scheme_label()} needs calibration samples")
    digest = hashlib.sha256(json.dumps(samples).encode()).hexdigest()[:8] if knobs.reads_calibration() else None
    key = format_key(knobs, digest)

    def derive(tmp: Path) -> None:
        spec_file = tmp / "spec.json"
        spec_file.write_text(json.dumps({
            "base": str(base), "out": str(tmp), "weight_format": knobs.weight_format,
            "int4_method": knobs.int4_method, "group_size": knobs.group_size, "ratio": knobs.ratio,
            "samples": samples if knobs.reads_calibration() else []}))
        _run_tool(["compress", str(spec_file)], f"{key} weights from the fp32 IR (once)")
        spec_file.unlink()

    return _made(root / key, derive)
