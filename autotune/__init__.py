"""autotune: search the deployment knobs of a language model on given hardware."""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
