"""The speed baselines a study measured, as every view reads them: each with its name, what it ran and its figures,
a baseline that is the same measurement as an earlier one listed once. Studies from before there were two hold
one (`speed_baseline`)."""
from __future__ import annotations

__all__ = ["study_baselines", "gains"]


def study_baselines(attrs: dict) -> list[dict]:
    """[{name, what, dtype, batch_size, bench, names}], in the space file's order; `names` lists every baseline
    the measurement stands for."""
    stored = attrs.get("speed_baselines")
    if not stored:
        one = attrs.get("speed_baseline")
        return [{"name": "the baseline", "names": ["the baseline"], **one}] if one and one.get("bench") else []
    out: list[dict] = []
    for name, entry in stored.items():
        if entry.get("same_as"):
            twin = next((b for b in out if b["name"] == entry["same_as"]), None)
            if twin is not None:
                twin["names"].append(name)
                continue
        if entry.get("bench"):
            out.append({**entry, "name": name, "names": [name]})
    return out


def gains(bench: dict, baselines: list[dict]) -> list[tuple[str, float | None]]:
    """(baseline label, throughput gain) against each baseline: "x1.52 vs as_loaded (bf16)"."""
    out = []
    for b in baselines:
        label = f"{'/'.join(b['names'])} ({b.get('dtype') or '?'})"
        base = b["bench"].get("throughput_tok_s")
        out.append((label, bench["throughput_tok_s"] / base if base else None))
    return out
