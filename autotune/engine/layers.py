"""The decoder layer over a paged KV cache: one prefill path (dense, causal) and one decode path (paged).

LLaMA's layer, plus what the other supported families change (LayerOptions): biases, q/k norms, Gemma's norms
and soft-capping, sliding-window attention, partial rotary."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["DecoderLayer", "LayerOptions", "StepInputs", "apply_rope", "offset_rms_norm", "rms_norm", "softcap"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Same order of operations as transformers' LlamaRMSNorm, so fp32 results match it bit for bit.
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def offset_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Gemma's RMSNorm: scale by (1 + weight) in fp32, then cast (transformers' Gemma2RMSNorm, same order).
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + weight.float())).type_as(x)


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    # cap * tanh(x / cap), in transformers' order of operations
    return torch.tanh(x / cap) * cap


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [..., heads, head_dim]; cos, sin: [..., 1, head_dim]
    return x * cos + _rotate_half(x) * sin


def _apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # Rope on the first rotary_dim features (cos, sin: [..., 1, rotary_dim]); the rest pass (Phi-3 family).
    rotary_dim = cos.shape[-1]
    return torch.cat((apply_rope(x[..., :rotary_dim], cos, sin), x[..., rotary_dim:]), dim=-1)


@dataclass(frozen=True, slots=True)
class LayerOptions:
    """What a layer does beyond LLaMA's (the defaults).

    norm_offset: Gemma's RMSNorm, (1 + weight) in fp32. sandwich_norms: Gemma's norms on the attention and MLP
    outputs. qk_norm: an RMSNorm over each head's q and k before rope (Qwen3, Gemma 3). scale: attention scale
    (None: head_dim ** -0.5). softcap: tanh soft-capping of attention scores. windowed: attends only to the model's
    sliding window (the step's window_mask). local_rope: the step's local rope tables (Gemma 3's sliding layers).
    partial_rotary: rope on the first features only (the tables' width)."""

    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    norm_offset: bool = False
    sandwich_norms: bool = False
    activation: str = "silu"  # or "gelu_tanh"
    scale: float | None = None
    softcap: float | None = None
    windowed: bool = False
    local_rope: bool = False
    partial_rotary: bool = False


class StepInputs:
    """What one forward step needs besides the hidden states; built once per step, shared by all layers.

    prefill: several right-padded prompts, `slots` [seqs, seq_len] where their K/V go (pads: the scratch
    page); attention is causal over the step's own tokens. A prefill with a `block_table` [seqs, pages] is a
    chunk of prompts that continue in the cache: it attends to those pages under `context_mask`
    [seqs, 1, chunk, pages * page_size] (True where a key's position is at most the query's).
    decode: one token per row, `slots` [batch], `block_table` [batch, pages_per_seq], `context_mask`
    [1, batch, 1, pages_per_seq * page_size] (True where a slot holds a token of that row).
    Only for models that need them: `window_mask` (prefill [seq_len, seq_len], causal and within the sliding
    window; decode: as context_mask, and within the window), `causal_mask` (prefill [seq_len, seq_len], for
    attention computed without SDPA), `local_cos`/`local_sin` (rope of Gemma 3's sliding layers).
    """

    __slots__ = (
        "block_table",
        "causal_mask",
        "context_mask",
        "cos",
        "local_cos",
        "local_sin",
        "prefill",
        "sin",
        "slots",
        "window_mask",
    )

    def __init__(self, *, prefill: bool, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                 block_table: torch.Tensor | None = None, context_mask: torch.Tensor | None = None,
                 window_mask: torch.Tensor | None = None, causal_mask: torch.Tensor | None = None,
                 local_cos: torch.Tensor | None = None, local_sin: torch.Tensor | None = None) -> None:
        self.prefill = prefill
        self.cos = cos
        self.sin = sin
        self.slots = slots
        self.block_table = block_table
        self.context_mask = context_mask
        self.window_mask = window_mask
        self.causal_mask = causal_mask
        self.local_cos = local_cos
        self.local_sin = local_sin


class DecoderLayer(nn.Module):
    """One decoder layer with fused QKV and gate/up projections (LLaMA's, with `options` for the other families).

    Biases are kept apart from the linear layers, so that every quantizer (some drop biases) sees plain weights."""

    def __init__(self, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, intermediate: int,
                 eps: float, options: LayerOptions = LayerOptions()) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.intermediate = intermediate
        self.eps = eps
        self.options = options
        self.norm_offset = options.norm_offset
        self.scale = options.scale if options.scale is not None else head_dim ** -0.5
        self.softcap = options.softcap
        self.windowed = options.windowed
        self.input_norm = nn.Parameter(torch.ones(hidden))
        self.post_norm = nn.Parameter(torch.ones(hidden))  # in front of the MLP
        self.qkv_proj = nn.Linear(hidden, (num_heads + 2 * num_kv_heads) * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=False)
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.qkv_bias = nn.Parameter(torch.zeros((num_heads + 2 * num_kv_heads) * head_dim)) if options.qkv_bias \
            else None
        self.o_bias = nn.Parameter(torch.zeros(hidden)) if options.o_bias else None
        self.gate_up_bias = nn.Parameter(torch.zeros(2 * intermediate)) if options.mlp_bias else None
        self.down_bias = nn.Parameter(torch.zeros(hidden)) if options.mlp_bias else None
        self.q_norm = nn.Parameter(torch.ones(head_dim)) if options.qk_norm else None
        self.k_norm = nn.Parameter(torch.ones(head_dim)) if options.qk_norm else None
        # Gemma: a norm on the attention output (its post_attention_layernorm) and one on the MLP output.
        self.attn_out_norm = nn.Parameter(torch.ones(hidden)) if options.sandwich_norms else None
        self.mlp_out_norm = nn.Parameter(torch.ones(hidden)) if options.sandwich_norms else None

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return offset_rms_norm(x, weight, self.eps) if self.norm_offset else rms_norm(x, weight, self.eps)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return _apply_partial_rope(x, cos, sin) if self.options.partial_rotary else apply_rope(x, cos, sin)

    def _act(self, gate: torch.Tensor) -> torch.Tensor:
        return F.gelu(gate, approximate="tanh") if self.options.activation == "gelu_tanh" else F.silu(gate)

    def _dense_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         mask: torch.Tensor) -> torch.Tensor:
        """Prefill attention written out (soft-capping has no SDPA form), as transformers' eager attention.
        q: [seqs, heads, seq_len, head_dim]; k, v: [seqs, kv_heads, keys, head_dim]; mask: [seq_len, keys], or
        [seqs, 1, seq_len, keys] for a prompt chunk over its cached pages."""
        groups = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) * self.scale
        if self.softcap is not None:
            scores = softcap(scores, self.softcap)
        scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(probs, v)

    def _chunk_attention(self, q: torch.Tensor, step: StepInputs, k_pool: torch.Tensor,
                         v_pool: torch.Tensor) -> torch.Tensor:
        """A prompt chunk over its sequences' cached pages (its own K/V written there already).
        q: [seqs, chunk, heads, head_dim] -> [seqs, heads, chunk, head_dim]."""
        assert step.block_table is not None and step.context_mask is not None
        seqs, pages = step.block_table.shape
        context = pages * k_pool.shape[2]
        # keys, values: [kv_heads, seqs, context, head_dim] gathered, then [seqs, kv_heads, context, head_dim]
        pages_flat = step.block_table.flatten()
        keys = k_pool.index_select(1, pages_flat).view(self.num_kv_heads, seqs, context, self.head_dim)
        values = v_pool.index_select(1, pages_flat).view(self.num_kv_heads, seqs, context, self.head_dim)
        keys, values = keys.transpose(0, 1), values.transpose(0, 1)
        mask = step.window_mask if self.windowed else step.context_mask
        assert mask is not None
        if self.softcap is not None:
            return self._dense_attention(q.transpose(1, 2), keys, values, mask)
        return F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=True,
                                              scale=self.options.scale)

    def forward(self, x: torch.Tensor, step: StepInputs, k_pool: torch.Tensor, v_pool: torch.Tensor) -> torch.Tensor:
        # x: prefill [seqs, seq_len, hidden] (right-padded); decode [batch, hidden] (one token per row)
        lead = x.shape[:-1]
        h = self._norm(x, self.input_norm)
        qkv = self.qkv_proj(h)
        if self.qkv_bias is not None:
            qkv = qkv + self.qkv_bias
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q = qkv[..., :q_size].view(*lead, self.num_heads, self.head_dim)
        k = qkv[..., q_size:q_size + kv_size].view(*lead, self.num_kv_heads, self.head_dim)
        v = qkv[..., q_size + kv_size:].view(*lead, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self._norm(q, self.q_norm), self._norm(k, self.k_norm)
        cos, sin = step.cos, step.sin
        if self.options.local_rope:
            assert step.local_cos is not None and step.local_sin is not None
            cos, sin = step.local_cos, step.local_sin
        q = self._rope(q, cos, sin)
        k = self._rope(k, cos, sin)
        page_size = k_pool.shape[2]
        # Write this step's K/V into their pages; pools: [kv_heads, pages, page_size, head_dim].
        # A windowed layer keeps every page too: the window is a mask, so the sequence's pages serve all layers.
        page, offset = step.slots // page_size, step.slots % page_size
        k_pool[:, page, offset] = k.movedim(-2, 0)
        v_pool[:, page, offset] = v.movedim(-2, 0)
        if step.prefill and step.block_table is not None:
            out = self._chunk_attention(q, step, k_pool, v_pool).transpose(1, 2).reshape(*lead, q_size)
        elif step.prefill:
            # [seqs, heads, seq_len, head_dim]: prompts attend to themselves, causally; nothing older exists.
            # Right padding keeps this exact: a real token never sees the pads after it.
            if self.softcap is not None:
                mask = step.window_mask if self.windowed else step.causal_mask
                assert mask is not None
                out = self._dense_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)
            elif self.windowed:
                out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                     attn_mask=step.window_mask, enable_gqa=True,
                                                     scale=self.options.scale)
            else:
                out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                     is_causal=True, enable_gqa=True, scale=self.options.scale)
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
            scores = torch.matmul(q, keys.transpose(2, 3)).float() * self.scale
            if self.softcap is not None:
                scores = softcap(scores, self.softcap)
            mask = step.window_mask if self.windowed else step.context_mask
            assert mask is not None
            scores = scores.masked_fill(~mask, float("-inf"))
            probs = torch.softmax(scores, dim=-1).to(values.dtype)
            out = torch.matmul(probs, values).transpose(0, 1).reshape(batch, q_size)
        attn = self.o_proj(out)
        if self.o_bias is not None:
            attn = attn + self.o_bias
        if self.attn_out_norm is not None:
            attn = self._norm(attn, self.attn_out_norm)
        x = x + attn
        h = self._norm(x, self.post_norm)
        gate_up = self.gate_up_proj(h)
        if self.gate_up_bias is not None:
            gate_up = gate_up + self.gate_up_bias
        gate, up = gate_up.split(self.intermediate, dim=-1)
        mlp = self.down_proj(self._act(gate) * up)
        if self.down_bias is not None:
            mlp = mlp + self.down_bias
        if self.mlp_out_norm is not None:
            mlp = self._norm(mlp, self.mlp_out_norm)
        return x + mlp
