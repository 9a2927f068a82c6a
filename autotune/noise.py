"""Lines a fresh install prints that say nothing wrong: kept off the user's screen, each named here with why.

- torchao's "Failed to load .../torchao/_C_mxfp8...so" and "..._C_cutlass_90a.abi3.so": its CUDA-only kernels,
  which a CPU build of torch cannot load and autotune never calls on the CPU.
- torch's "<enum '...'> is an Enum subclass and is now natively supported by torch.compile ...": torchao 0.18
  registering its enums the way torch 2.13 deprecates; nothing of autotune's is concerned.

Only these messages are dropped: every other line of those loggers still shows."""
from __future__ import annotations

import logging

__all__ = ["quiet_known_noise", "KNOWN_NOISE"]

# (logger, a part of the message that marks the line)
KNOWN_NOISE = (("torchao", "Failed to load"), ("torch.utils._pytree", "is an Enum subclass and is now natively"))


class _Drop(logging.Filter):
    def __init__(self, part: str) -> None:
        super().__init__()
        self.part = part

    def filter(self, record: logging.LogRecord) -> bool:
        return self.part not in record.getMessage()


def quiet_known_noise() -> None:
    """Install the filters (once per process; again is harmless)."""
    for name, part in KNOWN_NOISE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) and f.part == part for f in logger.filters):
            logger.addFilter(_Drop(part))
