"""OpenVINO GenAI's ContinuousBatchingPipeline with one configuration's knobs, driven step by step: requests in as
token ids, greedy, each token timed as it comes (the figures autotune's own runner gives). Teacher forcing (the
decode check) through the same pipeline; every position's logits of one sequence (the gate's windows) through the
IR's stateful model compiled with the same precisions."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from autotune.config.deploy import DeployConfig
from autotune.engine.sequence import Completion, Request  # the engine's: one request and completion type for all
from autotune.errors import TrialFailure

__all__ = ["OpenVinoPipeline", "plugin_properties"]


def plugin_properties(config: DeployConfig, threads: int) -> dict:
    """The CPU plugin's properties of a configuration (ContinuousBatchingPipeline's and the stateful model's)."""
    return {"INFERENCE_PRECISION_HINT": config.inference_precision, "KV_CACHE_PRECISION": config.kv_precision,
            "INFERENCE_NUM_THREADS": threads}


@dataclass(slots=True)
class _Forced:
    """A teacher-forced request: the pipeline decodes freely, so each submission starts from the prompt and the
    forced tokens before `start`, and is stopped at its first choice that differs from the forced token there; the
    next submission starts after that position. Every choice is thus made on the forced prefix."""

    completion: Completion
    start: int = 0
    greedy: list[int] = field(default_factory=list)


class OpenVinoPipeline:
    """One ContinuousBatchingPipeline: `batch_size` sequences at most (max_num_seqs), the scheduler's token budget,
    KV cache size, split-fuse and prefix caching, the precisions, `threads` threads."""

    def __init__(self, folder: Path, config: DeployConfig, threads: int) -> None:
        import openvino_genai as genai

        self.folder, self.config, self.threads = folder, config, threads
        scheduler = genai.SchedulerConfig()
        scheduler.max_num_seqs = config.batch_size
        scheduler.max_num_batched_tokens = config.max_num_batched_tokens
        scheduler.cache_size = config.cache_size
        scheduler.dynamic_split_fuse = config.dynamic_split_fuse
        scheduler.enable_prefix_caching = config.prefix_caching
        try:
            self.pipe = genai.ContinuousBatchingPipeline(str(folder), scheduler, "CPU",
                                                         plugin_properties(config, threads))
        except RuntimeError as exc:
            raise TrialFailure(f"OpenVINO could not make a pipeline for {config.label()}: {_first_line(exc)}") from None
        self._next_id = 0
        self._stateful = None
        self._live: dict = {}  # a pipeline handle -> its Completion, or the _Forced state of a forced request
        self._block_bytes = _block_bytes(folder, config)

    def close(self) -> None:
        self.pipe = self._stateful = None

    def _generation(self, request: Request, new: int, min_new: int):
        import openvino_genai as genai

        gen = genai.GenerationConfig()
        gen.max_new_tokens = new
        gen.min_new_tokens = min_new
        gen.ignore_eos = min_new >= new  # the workload's requests and the reference's continuations run to length
        if request.eos_token_id is not None:
            gen.eos_token_id = request.eos_token_id
        if request.stop_ids:
            gen.stop_token_ids = set(request.stop_ids)
        sampling = request.sampling
        if sampling.temperature > 0 and not request.forced_ids:
            gen.do_sample, gen.temperature, gen.top_p = True, sampling.temperature, sampling.top_p
            if sampling.seed is not None:
                gen.rng_seed = sampling.seed
        return gen

    def _submit(self, ids: list[int], request: Request, new: int, min_new: int):
        import openvino as ov

        handle = self.pipe.add_request(self._next_id, ov.Tensor(np.array([ids], dtype=np.int64)),
                                       self._generation(request, new, min_new))
        self._next_id += 1
        return handle

    # Step-wise, as autotune's engine runner (engine/peer.py StepRunner): the server's engine loop drives it.
    @property
    def max_batch(self) -> int:
        return self.config.batch_size

    def submit(self, request: Request, arrival: float | None = None) -> Completion:
        """Queue a request; its Completion fills in as step() runs. Set `finish_reason` on it to cancel it.
        Forced requests record their greedy choices (Completion.greedy_ids) and emit the forced tokens."""
        c = Completion(request, arrival=time.perf_counter() if arrival is None else arrival)
        if request.forced_ids:
            self._live[self._submit(list(request.prompt_ids), request, request.max_new_tokens,
                                    request.max_new_tokens)] = _Forced(c)
        else:
            self._live[self._submit(list(request.prompt_ids), request, request.max_new_tokens,
                                    request.min_new_tokens)] = c
        return c

    @property
    def num_running(self) -> int:
        return self.pipe.get_metrics().scheduled_requests

    @property
    def num_waiting(self) -> int:
        metrics = self.pipe.get_metrics()
        return max(metrics.requests - metrics.scheduled_requests, 0)

    def kv_usage(self) -> tuple[int, int]:
        """(KV blocks in use, blocks allocated), from the pipeline's cache size and usage."""
        metrics = self.pipe.get_metrics()
        total = metrics.kv_cache_size_in_bytes // self._block_bytes if self._block_bytes else 0
        return round(total * metrics.cache_usage / 100), total

    def step(self) -> list[Completion]:
        """One scheduler step of the pipeline (its prompt chunks and every running sequence's next token); returns
        the completions that finished or were cancelled (their `finish_reason` set by the caller) during it."""
        done: list[Completion] = []
        for handle, owner in list(self._live.items()):
            c = owner.completion if isinstance(owner, _Forced) else owner
            if c.finish_reason:  # cancelled by the caller
                handle.stop()
                del self._live[handle]
                done.append(c)
        if not self._live:
            return done
        if not self.pipe.has_non_finished_requests():
            raise TrialFailure(f"OpenVINO finished {len(self._live)} request(s) without their tokens")
        self.pipe.step()
        now = time.perf_counter()
        for handle, owner in list(self._live.items()):
            tokens = [t for out in handle.read().values() for t in out.generated_ids] if handle.can_read() else []
            if isinstance(owner, _Forced):
                if self._forced_tokens(handle, owner, tokens):
                    del self._live[handle]
                    if owner.completion.finish_reason:
                        done.append(owner.completion)
                continue
            owner.output_ids.extend(tokens)
            owner.token_times.extend([now] * len(tokens))
            if _finished(handle):
                owner.finish_reason = "length" if len(owner.output_ids) >= owner.request.max_new_tokens else "stop"
                del self._live[handle]
                done.append(owner)
        return done

    def run(self, requests: list[Request]) -> list[Completion]:
        """Every request submitted at once (offline arrival); the scheduler admits `batch_size` at a time."""
        started = time.perf_counter()
        completions = [self.submit(r, arrival=started) for r in requests]
        while self._live:
            self.step()
        return completions

    def warm_up(self) -> None:
        """A full batch of short requests and a prompt longer than a step's token budget: the pipeline's first
        steps (its memory and kernels' first use) are not a user's."""
        self.run([Request([1] * 16, 2, min_new_tokens=2) for _ in range(self.max_batch)])
        self.run([Request([1] * (self.config.max_num_batched_tokens + 8), 2, min_new_tokens=2)])

    def _forced_tokens(self, handle, state: _Forced, tokens: list[int]) -> bool:
        """Take a forced submission's new choices; stopped and resubmitted past a differing one. True when this
        handle is done with."""
        c, r = state.completion, state.completion.request
        forced, n = list(r.forced_ids), r.max_new_tokens
        for token in tokens:
            position = len(state.greedy)
            state.greedy.append(token)
            c.output_ids.append(forced[position])
            c.token_times.append(time.perf_counter())
            if len(state.greedy) == n:
                c.greedy_ids, c.finish_reason = state.greedy, "length"
                handle.stop()
                return True
            if token != forced[position]:
                handle.stop()
                start = position + 1
                self._live[self._submit(list(r.prompt_ids) + forced[:start], r, n - start, n - start)] = state
                return True
        if _finished(handle):
            raise TrialFailure(f"OpenVINO ended a forced request at {len(state.greedy)} of {n} tokens")
        return False

    def all_logits(self, tokens: list[int]) -> np.ndarray:
        """Teacher-forced logits of one sequence at every position, [len(tokens), vocab] float32, from the IR's
        stateful model compiled with this configuration's precisions and threads: ContinuousBatchingPipeline gives
        no logits, and the one prefill reads no KV cache of earlier steps."""
        import openvino as ov

        if self._stateful is None:
            core = ov.Core()
            compiled = core.compile_model(core.read_model(self.folder / "openvino_model.xml"), "CPU",
                                          plugin_properties(self.config, self.threads))
            self._stateful = compiled.create_infer_request()
        request = self._stateful
        request.reset_state()
        n = len(tokens)
        request.infer({"input_ids": np.array([tokens], dtype=np.int64),
                       "attention_mask": np.ones((1, n), dtype=np.int64),
                       "position_ids": np.arange(n, dtype=np.int64)[None], "beam_idx": np.zeros(1, dtype=np.int32)})
        return np.array(request.get_tensor("logits").data[0], dtype=np.float32)

    def drop_stateful(self) -> None:
        """Free the stateful model (the gate's alone: no part of serving) before the benchmark."""
        self._stateful = None


# The CPU plugin's paged KV cache holds this many tokens a block.
_BLOCK_TOKENS = 32
_KV_BYTES = {"u8": 1, "u4": 0.5, "bf16": 2, "f32": 4}


def _block_bytes(folder: Path, config: DeployConfig) -> int:
    """Bytes of one KV block of every layer (keys and values), from the model's config.json; 0 where it cannot be
    read (the gauges then say 0)."""
    import json

    try:
        c = json.loads((folder / "config.json").read_text())
        head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        kv_heads = c.get("num_key_value_heads") or c["num_attention_heads"]
        return int(2 * c["num_hidden_layers"] * kv_heads * head_dim * _BLOCK_TOKENS * _KV_BYTES[config.kv_precision])
    except (OSError, KeyError, ValueError, ZeroDivisionError):
        return 0


def _finished(handle) -> bool:
    import openvino_genai as genai

    return handle.get_status() not in (genai.GenerationStatus.RUNNING,)


def _first_line(exc: Exception) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__

