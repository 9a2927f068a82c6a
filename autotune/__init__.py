"""autotune: search the deployment knobs of a language model on given hardware."""
from __future__ import annotations

__version__ = "0.1.0"
# Bump when the engine computes other numbers for the same configuration (a kernel, an order of operations): cached
# gate figures of older engines are then not reused.
ENGINE_VERSION = "3"
__all__ = ["__version__", "ENGINE_VERSION"]
