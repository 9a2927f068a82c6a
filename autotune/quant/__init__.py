"""Calibrated quantization: the calibration set, the statistics and AWQ scales measured once per model on it, the
per-layer sensitivity per scheme and method, and the plan a build reads (engine/calibrated.py applies it)."""
