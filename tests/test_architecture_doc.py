"""docs/architecture.md's layer table says what tests/test_layout.py enforces: the same layers, in the same order,
with the same packages, and every package of autotune/ in its tree."""
from __future__ import annotations

import re
from pathlib import Path

from tests.test_layout import LAYERS, ROOT

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def _table() -> list[tuple[int, tuple[str, ...]]]:
    rows = []
    for line in DOC.read_text().splitlines():
        m = re.match(r"\| (\d+) \| ([^|]+) \|", line)
        if m:
            rows.append((int(m.group(1)), tuple(re.findall(r"`(\w+)`", m.group(2)))))
    return rows


def test_the_layer_table_is_the_layouts():
    assert _table() == list(enumerate(LAYERS))


def test_the_tree_names_every_package():
    tree = DOC.read_text().split("```\nautotune/\n", 1)[1].split("```", 1)[0]
    named = set(re.findall(r"^  (\w+)/", tree, re.M))
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "data"}
    assert packages <= named, f"missing from docs/architecture.md's tree: {sorted(packages - named)}"
