"""Every figure that decides a calibrated build's numbers, in one place and without torch: the calibration cache's
folder and the gate cache's key are derived from `calibration_inputs()`, which reads every upper-case name here, so
that a figure added or changed here can never be served a stale calibration or gate. The modules that use these
(quant/calib_set.py, quant/sensitivity.py, quant/awq.py, engine/calibrated.py) import them from here."""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

__all__ = ["NUM_SAMPLES", "SAMPLE_TOKENS", "DISJOINT_RUN", "SENSITIVITY_SAMPLES", "MEASURE", "AWQ_GRID",
           "SMOOTHQUANT_ALPHA", "CALIBRATION_VERSION", "CALIB_FILES", "calibration_inputs", "needs_plan"]

_CALIB_DIR = Path(__file__).resolve().parent.parent / "data" / "calib"
CALIB_FILES = (_CALIB_DIR / "apache-2.0_mpl-2.0.txt", _CALIB_DIR / "mpl-1.1.txt", _CALIB_DIR / "artistic.txt",
               _CALIB_DIR / "cc0-1.0.txt")
# The reference deployment (Ascend 910, W8A16) calibrated with 512 samples; 64 proved too few.
NUM_SAMPLES = 512
SAMPLE_TOKENS = 64
# No sample shares this many consecutive tokens with the evaluation text.
DISJOINT_RUN = 16
# Calibration samples (every k-th of the set) the sensitivity is measured on: 32 x 64 = 2,048 positions.
SENSITIVITY_SAMPLES = 32
MEASURE = ("expected KL(reference || model with this layer quantized), to second order: 1/2 (g . dy)^2 per "
           "position, g the gradient of log p(label ~ reference) with respect to the layer's output")
AWQ_GRID = 20  # candidates, as torchao's scale_search_space_size and llm-awq's n_grid
# SmoothQuant's migration strength: torchao's default and the paper's for LLaMA-class models.
SMOOTHQUANT_ALPHA = 0.5
# Bump when how a calibration is computed changes in a way the figures above do not say.
CALIBRATION_VERSION = "2"


def calibration_inputs() -> dict:
    """Every upper-case figure of this module by name, and the calibration files by content digest."""
    module = sys.modules[__name__]
    out = {name: getattr(module, name) for name in dir(module)
           if name.isupper() and not name.startswith("_") and name != "CALIB_FILES"}
    out["files"] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in CALIB_FILES}
    return out


def needs_plan(config) -> bool:
    """Whether a DeployConfig's build reads the calibration (its runtime's knobs say)."""
    return config.knobs.reads_calibration()
