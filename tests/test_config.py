from __future__ import annotations

import pytest

from autotune.config.deploy import DeployConfig


def test_split_only_with_fusion():
    with pytest.raises(ValueError, match="only to fused"):
        DeployConfig(fusion_level="O0", layers_per_subgraph=2)
    with pytest.raises(ValueError, match="need layers_per_subgraph"):
        DeployConfig(fusion_level="O1")
    assert DeployConfig.from_params({"fusion_level": "O2", "layers_per_subgraph": "all"}).layers_per_subgraph == 0


@pytest.mark.parametrize("bad", [{"quant": "fp8"}, {"batch_size": 0}, {"kv_policy": "lazy"}, {"page_size": -4}])
def test_invalid_values_are_refused(bad):
    with pytest.raises(ValueError):
        DeployConfig.from_dict(bad)


def test_numerics_key_ignores_speed_knobs():
    a = DeployConfig(quant="w8a16", batch_size=1, page_size=16)
    b = DeployConfig(quant="w8a16", batch_size=16, page_size=256, kv_policy="pool", device_power=1)
    assert a.numerics_key() == b.numerics_key() and a.digest() != b.digest()
    assert a.numerics_key() != DeployConfig(quant="w8a8").numerics_key()
