"""The engine's model: HF weights (LLaMA and the other supported families, autotune/models/architectures.py) in
decoder layers grouped into segments, each run (or compiled) as one unit."""
from __future__ import annotations

import torch
import torch._dynamo
from torch import nn

from autotune.engine.kv_cache import PagedKVCache
from autotune.engine.layers import DecoderLayer, LayerOptions, StepInputs, offset_rms_norm, rms_norm, softcap
from autotune.models.architectures import (
    ACTIVATIONS,
    Architecture,
    check_config,
    context_length,
    rope_parameters_by_layer_type,
    windowed_layers,
)

__all__ = ["EngineModel", "Segment", "rope_tables", "DYNAMIC_DIMS", "mark_dynamic"]

# The dimensions of each entry's inputs that change from call to call, by input name; every other dimension is
# static. Dynamo is told here (mark_dynamic: one graph for all their sizes, not one per size), and O2's packages
# export these and only these as dynamic (engine/packaged.py). Pools [kv_heads, pages, page_size, head_dim] grow by
# pages (on_demand). Prefill: prompts and their length. A prompt chunk: its length, its pages and the context (mask
# [seqs, 1, chunk, context]). Decode, where its width varies (serving: `dynamic_context`): the pages its rows use
# (block table [batch, pages], masks [1, batch, 1, context]); its batch is static, one graph per batch bucket.
# Head: the rows.
_POOLS = {"k_pools": (1,), "v_pools": (1,)}
DYNAMIC_DIMS: dict[str, dict[str, tuple[int, ...]]] = {
    "prefill": {"x": (0, 1), "cos": (0, 1), "sin": (0, 1), "slots": (0, 1), "window_mask": (0, 1),
                "causal_mask": (0, 1), "local_cos": (0, 1), "local_sin": (0, 1), **_POOLS},
    "chunk": {"x": (1,), "cos": (1,), "sin": (1,), "slots": (1,), "block_table": (1,), "context_mask": (2, 3),
              "window_mask": (2, 3), "local_cos": (1,), "local_sin": (1,), **_POOLS},
    "decode": {"block_table": (1,), "context_mask": (3,), "window_mask": (3,), **_POOLS},
    "head": {"x": (0,)},
    "pools": _POOLS,  # every entry's
}


def mark_dynamic(kind: str, inputs: dict[str, torch.Tensor]) -> None:
    """Tell dynamo which dimensions of an entry's inputs vary (DYNAMIC_DIMS[kind]); a size of 0 or 1 it still
    specialises."""
    dims = DYNAMIC_DIMS[kind]
    for name, tensor in inputs.items():
        for dim in dims.get(name, ()):
            torch._dynamo.maybe_mark_dynamic(tensor, dim)


def rope_tables(cfg, layer_type: str | None, head_dim: int, length: int,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, rotary_dim] for the rope parameters of `layer_type` (None: the config's only ones), as
    transformers' rotary embedding computes them: fp32 tables (times the scaling's attention factor), cast to the
    compute dtype."""
    rope = cfg.rope_parameters[layer_type] if layer_type is not None else cfg.rope_parameters
    rope_type = rope.get("rope_type", "default")
    rotary_dim = int(head_dim * (rope.get("partial_rotary_factor") or 1.0))
    if rope_type == "default":
        inv_freq = 1.0 / (rope["rope_theta"] ** (
            torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
        attention_factor = 1.0
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        # transformers' own functions (linear, dynamic, llama3, yarn, longrope), on the config object
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[rope_type](cfg, None, layer_type=layer_type)
        inv_freq = inv_freq.float()
    freqs = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos.to(dtype), sin.to(dtype)


class Segment(nn.Module):
    """A run of consecutive decoder layers: the unit that one compiled graph covers."""

    def __init__(self, layers: list[DecoderLayer], first_layer: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.first_layer = first_layer

    def forward(self, x: torch.Tensor, step: StepInputs, k_pools: list[torch.Tensor],
                v_pools: list[torch.Tensor]) -> torch.Tensor:
        for layer, k_pool, v_pool in zip(self.layers, k_pools, v_pools):
            x = layer(x, step, k_pool, v_pool)
        return x

    # Prefill and decode enter through their own functions so that, compiled, each has its own graphs and
    # shape history: prefill shapes vary with the prompts, decode shapes only by batch bucket (rows are padded).
    def prefill(self, x: torch.Tensor, step: StepInputs, k_pools: list[torch.Tensor],
                v_pools: list[torch.Tensor]) -> torch.Tensor:
        return self.forward(x, step, k_pools, v_pools)

    def decode(self, x: torch.Tensor, step: StepInputs, k_pools: list[torch.Tensor],
               v_pools: list[torch.Tensor]) -> torch.Tensor:
        return self.forward(x, step, k_pools, v_pools)


class EngineModel(nn.Module):
    """A decoder-only forward over a paged KV cache. Built from a transformers *ForCausalLM (fp32) of a supported
    architecture and a dtype; any other is refused (UnsupportedModel) before a weight is copied."""

    def __init__(self, hf_model: nn.Module, dtype: torch.dtype, layers_per_segment: int | None = None) -> None:
        super().__init__()
        cfg = hf_model.config
        arch = check_config(cfg)
        self.architecture = arch.model_type
        self.dtype = dtype
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.num_layers = cfg.num_hidden_layers
        self.eps = cfg.rms_norm_eps
        self.norm_offset = arch.norm_offset
        self.final_softcap: float | None = getattr(cfg, "final_logit_softcapping", None) if arch.final_softcap \
            else None
        windowed = windowed_layers(cfg, arch)
        self.sliding_window: int | None = int(cfg.sliding_window) if any(windowed) else None
        eos = cfg.eos_token_id
        self.eos_token_id: int | None = eos[0] if isinstance(eos, list) else eos
        inner = hf_model.model
        # copy=True: in fp32 a plain .to() returns the checkpoint's own tensor, which lives in the safetensors
        # file's mapping; holding it kept the whole mapping resident (400 MB of SmolLM2) after the HF model went.
        self.embed = nn.Embedding.from_pretrained(inner.embed_tokens.weight.detach().to(dtype, copy=True),
                                                  freeze=True)
        # Gemma scales embeddings by sqrt(hidden), rounded to the weights' dtype as transformers does.
        self.embed_scale: torch.Tensor | None
        self.register_buffer("embed_scale", torch.tensor(cfg.hidden_size ** 0.5).to(dtype) if arch.embed_scale
                             else None, persistent=False)
        self.final_norm = nn.Parameter(inner.norm.weight.detach().to(dtype, copy=True), requires_grad=False)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=dtype)
        self.lm_head.weight = (self.embed.weight if cfg.tie_word_embeddings
                               else nn.Parameter(hf_model.lm_head.weight.detach().to(dtype, copy=True),
                                                 requires_grad=False))
        # Gemma 3: sliding layers take their own (local) rope parameters, the others the full_attention ones.
        local_rope = [arch.rope_per_layer_type and kind == "sliding_attention"
                      for kind in getattr(cfg, "layer_types", None) or [None] * self.num_layers]
        layers = [self._convert_layer(hf_layer, cfg, arch, dtype, windowed[i], local_rope[i])
                  for i, hf_layer in enumerate(inner.layers)]
        # Soft-capped attention is written out in prefill, with an explicit causal mask.
        self.needs_causal_mask = any(layer.softcap is not None for layer in layers)
        size = layers_per_segment or len(layers)
        self.segments = nn.ModuleList(Segment(layers[i:i + size], i) for i in range(0, len(layers), size))
        # Positions the rope tables cover: the model's context (longrope: where transformers' short factors end).
        length = self.max_position = context_length(cfg, arch)
        cos, sin = rope_tables(cfg, "full_attention" if arch.rope_per_layer_type else None, self.head_dim, length,
                               dtype)
        self.register_buffer("cos_table", cos, persistent=False)
        self.register_buffer("sin_table", sin, persistent=False)
        self.local_cos_table: torch.Tensor | None
        self.local_sin_table: torch.Tensor | None
        local = rope_tables(cfg, "sliding_attention", self.head_dim, length, dtype) if any(local_rope) \
            else (None, None)
        self.register_buffer("local_cos_table", local[0], persistent=False)
        self.register_buffer("local_sin_table", local[1], persistent=False)
        self.requires_grad_(False)

    def _convert_layer(self, hf_layer: nn.Module, cfg, arch: Architecture, dtype: torch.dtype, windowed: bool,
                       local_rope: bool) -> DecoderLayer:
        attn, mlp = hf_layer.self_attn, hf_layer.mlp
        if arch.fused_checkpoint:  # Phi-3 stores them fused already, in the same order (q, k, v; gate, up)
            qkv_bias, gate_up_bias = attn.qkv_proj.bias, mlp.gate_up_proj.bias
        else:
            qkv_bias = None if attn.q_proj.bias is None else torch.cat([attn.q_proj.bias, attn.k_proj.bias,
                                                                        attn.v_proj.bias])
            gate_up_bias = None if mlp.gate_proj.bias is None else torch.cat([mlp.gate_proj.bias, mlp.up_proj.bias])
        rope = rope_parameters_by_layer_type(cfg, arch)
        options = LayerOptions(
            qkv_bias=qkv_bias is not None, o_bias=attn.o_proj.bias is not None, mlp_bias=gate_up_bias is not None,
            qk_norm=arch.qk_norm, norm_offset=arch.norm_offset, sandwich_norms=arch.sandwich_norms,
            activation=ACTIVATIONS[getattr(cfg, arch.activation_field)],
            scale=cfg.query_pre_attn_scalar ** -0.5 if arch.query_pre_attn_scalar else None,
            softcap=getattr(cfg, "attn_logit_softcapping", None) if arch.attn_softcap else None,
            windowed=windowed, local_rope=local_rope,
            partial_rotary=arch.partial_rotary and any(
                (r.get("partial_rotary_factor") or 1.0) != 1.0 for r in rope.values()),
        )
        layer = DecoderLayer(cfg.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim,
                             cfg.intermediate_size, cfg.rms_norm_eps, options).to(dtype)
        with torch.no_grad():
            layer.input_norm.copy_(hf_layer.input_layernorm.weight)
            if arch.sandwich_norms:  # Gemma's post_attention_layernorm is on the attention output
                layer.attn_out_norm.copy_(hf_layer.post_attention_layernorm.weight)
                layer.post_norm.copy_(hf_layer.pre_feedforward_layernorm.weight)
                layer.mlp_out_norm.copy_(hf_layer.post_feedforward_layernorm.weight)
            else:
                layer.post_norm.copy_(hf_layer.post_attention_layernorm.weight)
            if arch.fused_checkpoint:
                layer.qkv_proj.weight.copy_(attn.qkv_proj.weight)
                layer.gate_up_proj.weight.copy_(mlp.gate_up_proj.weight)
            else:
                layer.qkv_proj.weight.copy_(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
                layer.gate_up_proj.weight.copy_(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
            layer.o_proj.weight.copy_(attn.o_proj.weight)
            layer.down_proj.weight.copy_(mlp.down_proj.weight)
            for name, value in (("qkv_bias", qkv_bias), ("o_bias", attn.o_proj.bias),
                                ("gate_up_bias", gate_up_bias), ("down_bias", mlp.down_proj.bias)):
                if value is not None:
                    getattr(layer, name).copy_(value)
            if arch.qk_norm:
                layer.q_norm.copy_(attn.q_norm.weight)
                layer.k_norm.copy_(attn.k_norm.weight)
        return layer

    def new_cache(self, *, page_size: int, policy: str, max_seq_len: int, max_batch: int,
                  pool_tokens: int | None = None) -> PagedKVCache:
        return PagedKVCache(num_layers=self.num_layers, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                            page_size=page_size, policy=policy, max_seq_len=max_seq_len, max_batch=max_batch,
                            dtype=self.dtype, pool_tokens=pool_tokens, device=self.cos_table.device)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos_table[positions].unsqueeze(-2), self.sin_table[positions].unsqueeze(-2)

    def _step_extras(self, positions: torch.Tensor, prefill: bool,
                     context_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """What only some architectures need in StepInputs: window and causal masks, Gemma 3's local rope."""
        extras: dict[str, torch.Tensor] = {}
        if self.local_cos_table is not None and self.local_sin_table is not None:
            extras["local_cos"] = self.local_cos_table[positions].unsqueeze(-2)
            extras["local_sin"] = self.local_sin_table[positions].unsqueeze(-2)
        if prefill:
            # Prompts start at position 0: query i sees key j when j <= i, and (windowed) i - j < window.
            pos = positions[0]
            causal = pos[None, :] <= pos[:, None]
            if self.sliding_window is not None:
                extras["window_mask"] = causal & (pos[:, None] - pos[None, :] < self.sliding_window)
            if self.needs_causal_mask:
                extras["causal_mask"] = causal
        elif self.sliding_window is not None:
            assert context_mask is not None
            # Slot c of a row's gathered pages holds position c: keep those above position - window.
            context = context_mask.shape[-1]
            recent = torch.arange(context, device=positions.device) > (positions - self.sliding_window)[:, None]
            extras["window_mask"] = context_mask & recent.view_as(context_mask)
        return extras

    def _embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(token_ids)
        return x if self.embed_scale is None else x * self.embed_scale

    def _layers(self, x: torch.Tensor, step: StepInputs, cache: PagedKVCache) -> torch.Tensor:
        for name, pools in (("k_pools", cache.k_pools), ("v_pools", cache.v_pools)):
            for pool in pools:  # on_demand pools grow: one graph for every pool size rather than one per growth
                mark_dynamic("pools", {name: pool})
        for seg in self.segments:
            end = seg.first_layer + len(seg.layers)
            run = seg.prefill if step.prefill else seg.decode
            x = run(x, step, cache.k_pools[seg.first_layer:end], cache.v_pools[seg.first_layer:end])
        return x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., hidden] -> fp32 logits [..., vocab]. Compiled with the segments when fused."""
        if self.norm_offset:
            x = offset_rms_norm(x, self.final_norm, self.eps)
        else:
            x = rms_norm(x, self.final_norm, self.eps)
        logits = self.lm_head(x).float()
        return logits if self.final_softcap is None else softcap(logits, self.final_softcap)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        """x: [rows, hidden]. Every caller (the gate's windows, prefill's last positions, decode) passes rows of one
        rank with their count marked dynamic, so that a compiled head is one graph for all of them."""
        mark_dynamic("head", {"x": x})
        return self.logits(x)

    @torch.inference_mode()
    def prefill(self, token_ids: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor,
                all_logits: bool = False) -> torch.Tensor:
        """Prompts from position 0: token_ids, slots [seqs, seq_len], right-padded; lengths [seqs].

        Returns logits [seqs, seq_len, vocab] when all_logits (on the host: they are scored there), else each
        prompt's last position's [seqs, vocab]."""
        # The runner builds its inputs on the host; on an accelerator they move to the weights (no-op on the CPU).
        device = self.cos_table.device
        token_ids, slots, lengths = token_ids.to(device), slots.to(device), lengths.to(device)
        positions = torch.arange(token_ids.shape[1], device=device).expand_as(token_ids)
        cos, sin = self._rope(positions)
        x = self._embed(token_ids)
        extras = self._step_extras(positions, prefill=True)
        mark_dynamic("prefill", {"x": x, "cos": cos, "sin": sin, "slots": slots, **extras})
        x = self._layers(x, StepInputs(prefill=True, cos=cos, sin=sin, slots=slots, **extras), self._cache)
        if not all_logits:
            return self._head(x[torch.arange(x.shape[0], device=device), lengths - 1])
        seqs, length, hidden = x.shape
        return self._head(x.reshape(seqs * length, hidden)).reshape(seqs, length, -1).cpu()

    @torch.inference_mode()
    def prefill_chunk(self, token_ids: torch.Tensor, starts: torch.Tensor, slots: torch.Tensor,
                      block_table: torch.Tensor) -> torch.Tensor:
        """Prompt chunks that continue what the cache holds: token_ids, slots [seqs, chunk] (no padding), starts
        [seqs] (each chunk's first position), block_table [seqs, pages] (the pages up to each chunk's end). Each
        token attends to its sequence's earlier positions and causally within the chunk; returns the logits of each
        chunk's last position [seqs, vocab]."""
        device = self.cos_table.device  # host-built inputs move to the weights (no-op on the CPU)
        token_ids, starts, slots, block_table = (t.to(device) for t in (token_ids, starts, slots, block_table))
        positions = starts[:, None] + torch.arange(token_ids.shape[1], device=device)
        cos, sin = self._rope(positions)
        context = block_table.shape[1] * self._cache.page_size
        # Slot c of a row's gathered pages holds position c: a query at position p sees c <= p.
        key_pos = torch.arange(context, device=device)
        mask = (key_pos <= positions[:, :, None]).unsqueeze(1)  # [seqs, 1, chunk, context]
        extras: dict[str, torch.Tensor] = {}
        if self.local_cos_table is not None and self.local_sin_table is not None:
            extras["local_cos"] = self.local_cos_table[positions].unsqueeze(-2)
            extras["local_sin"] = self.local_sin_table[positions].unsqueeze(-2)
        if self.sliding_window is not None:
            extras["window_mask"] = mask & (positions[:, :, None] - key_pos < self.sliding_window).unsqueeze(1)
        x = self._embed(token_ids)
        mark_dynamic("chunk", {"x": x, "cos": cos, "sin": sin, "slots": slots, "block_table": block_table,
                               "context_mask": mask, **extras})
        step = StepInputs(prefill=True, cos=cos, sin=sin, slots=slots, block_table=block_table, context_mask=mask,
                          **extras)
        return self._head(self._layers(x, step, self._cache)[:, -1])

    @torch.inference_mode()
    def decode(self, token_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               block_table: torch.Tensor, context_mask: torch.Tensor, dynamic_context: bool = False) -> torch.Tensor:
        """One token per row: token_ids, positions, slots [batch], block_table [batch, pages], context_mask
        [1, batch, 1, pages * page_size]; returns logits [batch, vocab]. `dynamic_context`: the width (pages)
        changes from step to step, and one graph per batch bucket takes every width of 2 pages or more."""
        device = self.cos_table.device  # host-built step inputs move to the weights (no-op on the CPU)
        token_ids, positions, slots, block_table, context_mask = (
            t.to(device) for t in (token_ids, positions, slots, block_table, context_mask))
        cos, sin = self._rope(positions)
        x = self._embed(token_ids)
        # One graph per batch bucket (the runner pads rows to a few sizes), each with static shapes, rather than
        # the one dynamic graph that dynamo would switch to on the second size.
        for t in (x, cos, sin, slots, block_table):
            torch._dynamo.mark_static(t, 0)
        torch._dynamo.mark_static(context_mask, 1)
        extras = self._step_extras(positions, False, context_mask)
        if dynamic_context:
            mark_dynamic("decode", {"block_table": block_table, "context_mask": context_mask, **extras})
        step = StepInputs(prefill=False, cos=cos, sin=sin, slots=slots, block_table=block_table,
                          context_mask=context_mask, **extras)
        return self._head(self._layers(x, step, self._cache))

    def attach(self, cache: PagedKVCache) -> None:
        self._cache = cache
