"""The analytical simulator: hardware profiles as data, and a roofline-plus-overheads model of LLM inference."""
from __future__ import annotations

from autotune.sim.hardware import HardwareProfile, list_profiles, load_profile
from autotune.sim.predict import Prediction, predict

__all__ = ["HardwareProfile", "list_profiles", "load_profile", "Prediction", "predict"]
