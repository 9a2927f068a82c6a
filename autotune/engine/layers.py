"""The LLaMA decoder layer over a paged KV cache: one prefill path (dense, causal) and one decode path (paged)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["rms_norm", "apply_rope", "DecoderLayer", "StepInputs"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Same order of operations as transformers' LlamaRMSNorm, so fp32 results match it bit for bit.
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [..., heads, head_dim]; cos, sin: [..., 1, head_dim]
    return x * cos + _rotate_half(x) * sin


class StepInputs:
    """What one forward step needs besides the hidden states; built once per step, shared by all layers.

    prefill: several right-padded prompts, `slots` [seqs, seq_len] where their K/V go (pads: the scratch
    page); attention is causal over the step's own tokens.
    decode: one token per row, `slots` [batch], `block_table` [batch, pages_per_seq], `context_mask`
    [1, batch, 1, pages_per_seq * page_size] (True where a slot holds a token of that row).
    """

    __slots__ = ("prefill", "cos", "sin", "slots", "block_table", "context_mask")

    def __init__(self, *, prefill: bool, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                 block_table: torch.Tensor | None = None, context_mask: torch.Tensor | None = None) -> None:
        self.prefill = prefill
        self.cos = cos
        self.sin = sin
        self.slots = slots
        self.block_table = block_table
        self.context_mask = context_mask


class DecoderLayer(nn.Module):
    """One LLaMA decoder layer with fused QKV and gate/up projections."""

    def __init__(self, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, intermediate: int,
                 eps: float) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.intermediate = intermediate
        self.eps = eps
        self.input_norm = nn.Parameter(torch.ones(hidden))
        self.post_norm = nn.Parameter(torch.ones(hidden))
        self.qkv_proj = nn.Linear(hidden, (num_heads + 2 * num_kv_heads) * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=False)
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor, step: StepInputs, k_pool: torch.Tensor, v_pool: torch.Tensor) -> torch.Tensor:
        # x: prefill [seqs, seq_len, hidden] (right-padded); decode [batch, hidden] (one token per row)
        lead = x.shape[:-1]
        h = rms_norm(x, self.input_norm, self.eps)
        qkv = self.qkv_proj(h)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q = qkv[..., :q_size].view(*lead, self.num_heads, self.head_dim)
        k = qkv[..., q_size:q_size + kv_size].view(*lead, self.num_kv_heads, self.head_dim)
        v = qkv[..., q_size + kv_size:].view(*lead, self.num_kv_heads, self.head_dim)
        q = apply_rope(q, step.cos, step.sin)
        k = apply_rope(k, step.cos, step.sin)
        page_size = k_pool.shape[2]
        # Write this step's K/V into their pages; pools: [kv_heads, pages, page_size, head_dim].
        page, offset = step.slots // page_size, step.slots % page_size
        k_pool[:, page, offset] = k.movedim(-2, 0)
        v_pool[:, page, offset] = v.movedim(-2, 0)
        if step.prefill:
            # [seqs, heads, seq_len, head_dim]: prompts attend to themselves, causally; nothing older exists.
            # Right padding keeps this exact: a real token never sees the pads after it.
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=True, enable_gqa=True)
            out = out.transpose(1, 2).reshape(*lead, q_size)
        else:
            assert step.block_table is not None and step.context_mask is not None
            batch, pages = step.block_table.shape
            context = pages * page_size
            groups = self.num_heads // self.num_kv_heads
            # Gather each row's pages: keys, values [kv_heads, batch, context, head_dim], contiguous.
            pages_flat = step.block_table.flatten()
            keys = k_pool.index_select(1, pages_flat).view(self.num_kv_heads, batch, context, self.head_dim)
            values = v_pool.index_select(1, pages_flat).view(self.num_kv_heads, batch, context, self.head_dim)
            # One query per row, so plain matmuls beat SDPA's CPU kernel here; query heads grouped per KV head.
            # q: [kv_heads, batch, groups, head_dim] -> scores [kv_heads, batch, groups, context]
            q = q.view(batch, self.num_kv_heads, groups, self.head_dim).transpose(0, 1)
            scores = torch.matmul(q, keys.transpose(2, 3)).float() * (self.head_dim ** -0.5)
            scores = scores.masked_fill(~step.context_mask, float("-inf"))
            probs = torch.softmax(scores, dim=-1).to(values.dtype)
            out = torch.matmul(probs, values).transpose(0, 1).reshape(batch, q_size)
        x = x + self.o_proj(out)
        h = rms_norm(x, self.post_norm, self.eps)
        gate, up = self.gate_up_proj(h).split(self.intermediate, dim=-1)
        return x + self.down_proj(F.silu(gate) * up)
