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

    def close(self) -> None:
        self.pipe = self._stateful = None

    def _generation(self, request: Request, new: int, min_new: int):
        import openvino_genai as genai

        gen = genai.GenerationConfig()
        gen.max_new_tokens = new
        gen.min_new_tokens = min_new
        gen.ignore_eos = min_new >= new  # the workload's requests and the reference's continuations run to length
        if request.stop_ids:
            gen.stop_token_ids = set(request.stop_ids)
        return gen

    def _submit(self, ids: list[int], request: Request, new: int, min_new: int):
        import openvino as ov

        handle = self.pipe.add_request(self._next_id, ov.Tensor(np.array([ids], dtype=np.int64)),
                                       self._generation(request, new, min_new))
        self._next_id += 1
        return handle

    def run(self, requests: list[Request]) -> list[Completion]:
        """Every request submitted at once (offline arrival); the scheduler admits `batch_size` at a time. Forced
        requests record their greedy choices (Completion.greedy_ids) and emit the forced tokens."""
        completions = [Completion(r) for r in requests]
        live: dict = {}  # handle -> its completion, or its _Forced
        started = time.perf_counter()
        for c in completions:
            c.arrival = started
            r = c.request
            if r.forced_ids:
                state = _Forced(c)
                live[self._submit(list(r.prompt_ids), r, r.max_new_tokens, r.max_new_tokens)] = state
            else:
                live[self._submit(list(r.prompt_ids), r, r.max_new_tokens, r.min_new_tokens)] = c
        while live:
            if not self.pipe.has_non_finished_requests():
                raise TrialFailure(f"OpenVINO finished {len(live)} request(s) without their tokens")
            self.pipe.step()
            now = time.perf_counter()
            for handle, owner in list(live.items()):
                tokens = [t for out in handle.read().values() for t in out.generated_ids] if handle.can_read() else []
                done = isinstance(owner, _Forced) and self._forced_tokens(handle, owner, tokens, live)
                if not isinstance(owner, _Forced):
                    owner.output_ids.extend(tokens)
                    owner.token_times.extend([now] * len(tokens))
                    done = _finished(handle)
                    if done:
                        owner.finish_reason = "length" if len(owner.output_ids) >= owner.request.max_new_tokens \
                            else "stop"
                if done:
                    live.pop(handle, None)
        return completions

    def _forced_tokens(self, handle, state: _Forced, tokens: list[int], live: dict) -> bool:
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
                live[self._submit(list(r.prompt_ids) + forced[:start], r, n - start, n - start)] = state
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


def _finished(handle) -> bool:
    import openvino_genai as genai

    return handle.get_status() not in (genai.GenerationStatus.RUNNING,)


def _first_line(exc: Exception) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__

