"""Rewrites every block a page marks with the table rendered from its benchmark record:

    <!-- data: docs/data/NAME.json -->
    (what bench_tables.render makes of that record)
    <!-- /data -->

    python scripts/render_docs.py           # rewrite README.md and docs/*.md in place
    python scripts/render_docs.py --check   # exit 1, naming the blocks, where a page differs from its records

tests/test_docs_tables.py runs the check: a figure in a marked block is never edited by hand."""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_tables import render  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
BLOCK = re.compile(r"(<!-- data: (docs/data/[\w.-]+\.json) -->\n)(.*?)(<!-- /data -->)", re.S)


def rendered(page: Path) -> str:
    def block(m: re.Match) -> str:
        return m.group(1) + render(json.loads((ROOT / m.group(2)).read_text())) + "\n" + m.group(4)
    return BLOCK.sub(block, page.read_text())


def blocks(page: Path) -> list[str]:
    return [m.group(2) for m in BLOCK.finditer(page.read_text())]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    stale = []
    for page in PAGES:
        text = rendered(page)
        if text != page.read_text():
            stale.append(page.relative_to(ROOT))
            if not args.check:
                page.write_text(text)
    for page in stale:
        print(f"{page}: {'differs from its records' if args.check else 'rewritten'}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
