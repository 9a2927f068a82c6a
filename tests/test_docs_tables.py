"""Every table of measured figures in the README and docs is rendered from a benchmark record under docs/data/
(scripts/render_docs.py, scripts/bench_tables.py): each marked block is exactly what its record renders to, each
record holds what a figure needs to be traced (commit, command, machine, every round), no measurement table sits
outside a block, and an order is claimed only where the rounds' ranges do not overlap."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import bench_tables  # noqa: E402
import render_docs  # noqa: E402


def _marked() -> list[tuple[Path, str]]:
    return [(page, name) for page in render_docs.PAGES for name in render_docs.blocks(page)]


def test_the_measurements_page_quotes_records():
    assert sum(page.name == "measurements.md" for page, _ in _marked()) >= 8


@pytest.mark.parametrize("page", render_docs.PAGES, ids=lambda p: p.name)
def test_every_marked_block_is_what_its_record_renders_to(page):
    assert render_docs.rendered(page) == page.read_text(), (
        f"{page.name} differs from its records: run python scripts/render_docs.py")


@pytest.mark.parametrize("page, name", _marked(), ids=lambda v: getattr(v, "name", v))
def test_each_record_carries_its_commit_command_machine_and_rounds(page, name):
    record = json.loads((ROOT / name).read_text())
    for key in ("commit", "command", "date", "machine", "rounds"):
        assert record.get(key), (name, key)
    machine = record["machine"]
    assert machine["cpu"] and machine["cpu_signature"]["family"] and machine["isa_level"] and machine["isa_flags"]
    assert re.fullmatch(r"[0-9a-f]{12}(\+dirty)?", record["commit"]), record["commit"]


def _outside_blocks(text: str) -> str:
    return render_docs.BLOCK.sub("", text)


def test_no_table_of_measured_figures_sits_outside_a_block():
    """A table row holding a decimal figure outside a block was copied by hand (the knob and option tables of the
    other pages hold no such figure)."""
    text = _outside_blocks((ROOT / "docs" / "measurements.md").read_text())
    rows = [line for line in text.splitlines() if line.startswith("|") and re.search(r"\d+\.\d", line)]
    assert not rows, rows


def test_an_order_is_claimed_only_where_the_rounds_do_not_overlap():
    def serve(offline, served):
        return {"versions": {"this": {"tree": "t", "offline": _spread(offline), "served": _spread(served),
                                      "ratio": 1.0, "round_ratios": [1.0], "tpot_p50_ms": {"offline": 1.0,
                                                                                           "served": 1.0},
                                      "order": bench_tables_compare(served, offline)}}}
    apart = bench_tables.serve_table(serve([200.0, 210.0], [180.0, 190.0]))
    overlapping = bench_tables.serve_table(serve([200.0, 210.0], [190.0, 205.0]))
    assert apart.splitlines()[-1].endswith("| lower |")
    assert overlapping.splitlines()[-1].endswith("| within noise |")


def bench_tables_compare(a, b):
    from bench_record import compare
    return compare(a, b)


def _spread(values):
    from bench_record import spread
    return spread(values)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens dropped, spaces as hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", render_docs.PAGES, ids=lambda p: p.name)
def test_every_link_and_named_path_resolves(page):
    """A link to a file or heading of this repository, and a path it names in code (`scripts/...`, `recipes/...`,
    `docs/...`), points at something that exists: no page cites what was deleted."""
    text = page.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.name}: link to missing {target}"
        if anchor and file.suffix == ".md":
            slugs = {_slug(h) for h in re.findall(r"^#+ (.+)$", file.read_text(), re.M)}
            assert anchor in slugs, f"{page.name}: link to missing heading {target}"
    for path in re.findall(r"(?<![\w/.-])((?:scripts|recipes|docs/data)/[\w.-]+(?:/[\w.-]+)*/?)", text):
        assert (ROOT / path.rstrip(".")).exists(), f"{page.name}: names missing {path}"
