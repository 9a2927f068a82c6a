"""One exception hierarchy: user mistakes say what to change, trial failures carry a reason."""
from __future__ import annotations

__all__ = ["AutotuneError", "UserInputError", "SpaceError", "ModelNotFound", "StorageError",
           "TrialFailure", "GateFailed", "BackendUnavailable"]


class AutotuneError(Exception):
    """Root of every error autotune raises on purpose."""


class UserInputError(AutotuneError):
    """Bad input from the user: the message says what to change. The CLI exits 2."""


class SpaceError(UserInputError):
    """A malformed or invalid search-space file (the message names file and line)."""


class ModelNotFound(UserInputError):
    """The model is neither a registry name nor a local Hugging Face folder."""


class StorageError(UserInputError):
    """The study storage cannot be reached or opened."""


class BackendUnavailable(UserInputError):
    """The backend's hardware or packages are absent on this machine."""


class TrialFailure(AutotuneError):
    """An expected failure of one trial (build, out of memory, compile error): the trial fails, the study goes on."""


class GateFailed(TrialFailure):
    """The configuration changed the model's predictions too much to be benchmarked."""
