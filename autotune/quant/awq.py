"""AWQ's per-input-channel scale search (Lin et al. 2023; torchao's AWQObserver does the same search), for the int4
scheme of this engine (engine/int4.py), scored over every calibration position at once.

For a layer with weight W [out, in] and calibration inputs X [tokens, in], a candidate scale s = mean|x|^r
(normalised so that sqrt(max(s) min(s)) = 1), r in 0, 1/grid, ..., is scored by the output error of the rounded,
rescaled weight: ||X W^T - (X / s) Q(W s)^T||^2 = tr(E G E^T) with E = W - Q(W s) / s and G = X^T X. Through G the
loss covers all 32,768 calibration positions at the cost of a [out, in] x [in, in] product per candidate; r = 0 is
round-to-nearest, so the chosen scale never scores worse than it on the calibration set."""
from __future__ import annotations

import torch

from autotune.config.calibration import AWQ_GRID
from autotune.engine.int4 import fake_quantize_int4, pick_group_size

__all__ = ["AWQ_GRID", "search_scale"]


def _loss(error: torch.Tensor, gram: torch.Tensor) -> float:
    return float(((error @ gram) * error).sum())


@torch.inference_mode()
def search_scale(weight: torch.Tensor, mean_abs: torch.Tensor, gram: torch.Tensor,
                 grid: int = AWQ_GRID) -> tuple[torch.Tensor, dict]:
    """(the scale [in] with the lowest loss, {"ratio", "loss", "rtn_loss"}). weight: fp32 [out, in]; mean_abs:
    [in]; gram: [in, in]."""
    weight = weight.float()
    group_size = pick_group_size(weight.shape[1])
    best, best_loss, best_ratio = torch.ones_like(mean_abs), float("inf"), 0.0
    rtn_loss = float("nan")
    for i in range(grid):
        ratio = i / grid
        scale = mean_abs.float().pow(ratio).clamp(min=1e-4)
        scale = scale / (scale.max() * scale.min()).sqrt()
        error = weight - fake_quantize_int4(weight * scale, group_size) / scale
        loss = _loss(error, gram)
        if i == 0:
            rtn_loss = loss
        if loss < best_loss:
            best, best_loss, best_ratio = scale, loss, ratio
    return best, {"ratio": best_ratio, "loss": best_loss, "rtn_loss": rtn_loss}
