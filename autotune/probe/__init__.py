"""The capability probe: what the device computes natively decides what the search space offers."""
from __future__ import annotations
