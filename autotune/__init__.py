"""autotune: search the deployment knobs of a language model on given hardware.

    import autotune
    result = autotune.search(model="smollm2-135m", trials=8, minutes=10)
"""
from __future__ import annotations

from typing import Any

from autotune.noise import quiet_known_noise

__version__ = "0.1.0"
quiet_known_noise()
# The API pulls in Optuna, the backends and torch's loaders: imported on first use, so that `import autotune` (and
# every trial child process, which imports it) stays cheap.
_API = ("search", "SearchResult", "ParetoPoint", "TrialCounts")
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        from autotune import api

        value = getattr(api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")
