"""A fresh install's harmless library lines (autotune/noise.py) are kept off the screen, and only those."""
from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from autotune.noise import KNOWN_NOISE, quiet_known_noise

_IMPORTS = "import torchao.quantization, transformers"


def _stderr(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300).stderr


@pytest.mark.slow
def test_importing_autotune_first_keeps_torchaos_cuda_kernel_lines_off_stderr():
    bare = _stderr(_IMPORTS)
    if not any(part in bare for _, part in KNOWN_NOISE):
        pytest.skip("this install's torchao and torch print none of the known lines")
    quiet = _stderr(f"import autotune; {_IMPORTS}")
    assert not any(part in quiet for _, part in KNOWN_NOISE), quiet[-2000:]


def test_only_the_known_lines_are_dropped(caplog):
    quiet_known_noise()
    quiet_known_noise()  # twice: one filter, not two
    logger = logging.getLogger("torchao")
    assert len(logger.filters) == len([f for f in logger.filters if type(f).__name__ == "_Drop"]) == 1
    with caplog.at_level(logging.WARNING, logger="torchao"):
        logger.warning("Failed to load /x/torchao/_C_mxfp8.so: Could not load this library")
        logger.warning("a real problem")
    assert [r.getMessage() for r in caplog.records] == ["a real problem"]
