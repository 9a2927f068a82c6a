"""The Python API: `autotune.search(...)` runs (or resumes) a study and returns a SearchResult, as `autotune search`
does from the shell (which is a thin wrapper over it)."""
from __future__ import annotations

from autotune.api.options import SearchOptions
from autotune.api.result import ParetoPoint, SearchResult, TrialCounts
from autotune.api.run import search, search_defaults

__all__ = ["search", "search_defaults", "SearchOptions", "SearchResult", "TrialCounts", "ParetoPoint"]
