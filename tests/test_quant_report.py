"""`autotune quant-report` on the tiny model: a row per scheme x method x fallback, gated as a trial is gated."""
from __future__ import annotations

import pytest

from autotune.cli.main import main
from autotune.quant import plan as plan_module
from autotune.quant.calib_set import calibration_samples
from autotune.quant.report import Row, format_table, passing_depth, report_configs


def test_configs_cover_each_meaningful_method_and_depth():
    configs = report_configs()
    labels = [c.scheme_label() for c in configs]
    assert labels[0] == "bf16" and "w8a16+fb8@bf16" in labels and "w4a16+awq+fb2@bf16" in labels
    assert "w8a8+smoothquant_static@bf16" in labels and "w8a8+smoothquant_dynamic+fb1@bf16" in labels
    assert len(configs) == 1 + 5 + 3 * 5 + 2 * 5
    assert [c.scheme_label() for c in report_configs(("w8a8",), ("smoothquant_static",), (0, 4), "fp32")] == [
        "w8a8+smoothquant_static@fp32", "w8a8+smoothquant_static+fb4@fp32"]


def test_the_table_says_at_which_depth_each_scheme_passes():
    rows = [Row("w8a8", "rtn", 0, 0.96, 0.9, 25.0, 24.0, 0.97, False, 200.0),
            Row("w8a8", "rtn", 4, 0.996, 0.96, 24.5, 24.0, 0.996, True, 210.0, tie_aware_interval=[0.9938, 0.9976],
                decode_interval=[0.9925, 0.9983], decode_positions=6144, decode_decided=False),
            Row("w4a16", "awq", 0, 0.8, 0.7, 30.0, 24.0, 0.8, False, 100.0)]
    assert passing_depth(rows) == {("w8a8", "rtn"): 4, ("w4a16", "awq"): None}
    table = format_table(rows)
    # Each agreement with its interval; a verdict taken from the point estimate at the cap says so.
    assert "| w8a8 | bf16 | rtn | 4 | 0.9960 (0.9938-0.9976) |" in table and "w8a8/rtn: passes from fallback 4" in table
    assert "| 0.9960 (0.9925-0.9983, 6144) |" in table and "pass (by the point estimate" in table
    assert "| w8a8 | bf16 | rtn | 0 | 0.9600 (-) |" in table
    assert "w4a16/awq: passes at no measured fallback depth" in table


@pytest.mark.slow
def test_cli_measures_the_tiny_model(tiny_model_folder, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path))
    monkeypatch.setattr(plan_module, "calibration_samples", lambda tok: calibration_samples(tok)[:128])
    code = main(["quant-report", "--model", str(tiny_model_folder), "--schemes", "w8a8",
                 "--methods", "smoothquant_static", "--fallback", "2", "--dtype", "fp32"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("\n| w8a8 | fp32 | smoothquant_static | 2 | 0.") == 1
    assert "w8a8/smoothquant_static: passes" in out
