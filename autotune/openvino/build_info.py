"""Which OpenVINO this is: openvino-genai's version (found without loading it), the versions a gate's figures are
keyed by, and what a trial records of the runtime and of the export environment."""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from autotune.gate.cache import numerics_versions as torch_numerics_versions
from autotune.openvino.export_env import export_requirements

__all__ = ["installed", "numerics_versions", "openvino_versions"]


def installed() -> str | None:
    """openvino-genai's version, or None where it is not installed."""
    try:
        return version("openvino-genai")
    except PackageNotFoundError:
        return None


def numerics_versions() -> dict[str, str | None]:
    """What an OpenVINO gate's figures were computed with, for its cache key (autotune/gate/cache.py): the versions a
    torch gate is keyed by (the reference is computed with them), OpenVINO's own (its kernels), and the export's
    (its IR and NNCF's scales)."""
    return {**torch_numerics_versions(), "openvino_genai": installed(), "export": " ".join(export_requirements())}


def openvino_versions() -> dict:
    """What a trial records: the runtime's packages and the export environment's pins."""
    import openvino

    return {"openvino": openvino.__version__, "openvino_genai": installed(),
            "export_env": " ".join(export_requirements())}
