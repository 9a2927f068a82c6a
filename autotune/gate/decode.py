"""The decode check: agreement through the configuration's own decode path, in stages until its verdict is
decided (autotune/gate/design.py gives the sizes and why)."""
from __future__ import annotations

from collections.abc import Callable

import torch

from autotune.engine import Engine, Request
from autotune.engine.runner import Runner
from autotune.engine.sequence import Completion
from autotune.gate.design import DECODE_STAGE_PROMPTS
from autotune.gate.reference import Reference, agreeing
from autotune.gate.verdict import design_effect, judge

__all__ = ["decode_check", "served_decode_check", "staged_decode"]


def decode_check(engine: Engine, reference: Reference, prompts: list[list[int]], tie_epsilon: float,
                 min_agreement: float, max_seq_len: int, pool_tokens: int | None,
                 stage: int = DECODE_STAGE_PROMPTS, bucketed: bool = False) -> dict:
    """Teacher-forced through the deployed decode path: each prompt is prefilled, then the reference's own
    continuation is fed token by token, and at every decode step the candidate's greedy choice is scored as in
    the windows. Forced tokens keep both sides on one prefix, so a lost decision is counted where it happens
    instead of ending the comparison. The first continuation token comes from the prefill's logits and is not
    scored.

    Staged: `stage` prompts at a time, as a batch of the configuration's size (prompts repeated where the batch is
    larger), over its page size, as in the benchmark; after each stage the verdict is judged on the prompts scored
    so far (autotune/gate/verdict.py), and an undecided one gets the next stage, until all of `prompts` (the cap).
    `bucketed`: through the serving runner's graphs (Engine.runner) rather than the offline runner's."""
    prompts = prompts[:len(reference.decode_tokens)]
    new = reference.decode_top_ids.shape[1]
    batch = engine.config.batch_size
    runner = engine.runner(max_seq_len=max(max_seq_len, max(map(len, prompts)) + new), pool_tokens=pool_tokens,
                           bucketed=bucketed)
    eos = engine.model.eos_token_id

    def greedy_ids(chunk: list[int]) -> list[list[int]]:
        rows = [chunk[k % len(chunk)] for k in range(max(batch, len(chunk)))]
        outs = runner.run([Request(prompts[i], new, min_new_tokens=new, eos_token_id=eos,
                                   forced_ids=tuple(reference.decode_tokens[i])) for i in rows])
        return [out.greedy_ids for out in outs[:len(chunk)]]  # a repeated prompt filled the batch: scored once

    return staged_decode(len(prompts), reference, tie_epsilon, min_agreement, stage, greedy_ids)


def served_decode_check(runner: Runner, eos_token_id: int | None, reference: Reference, prompts: list[list[int]],
                        tie_epsilon: float, min_agreement: float, stage: int = DECODE_STAGE_PROMPTS) -> dict:
    """The decode check through a serving runner, in arrival patterns that run each of its graphs (a first start
    checks the program it is about to serve: serve/first_start.py). Each stage: a group of each batch bucket's size
    arriving together (a prefill of that many whole prompts, then decode steps at that bucket), then the rest
    arriving a step apart while the earlier ones decode (where the runner prefills in chunks shorter than the
    prompts, each in chunks), the running batch passing through the buckets on its way up and down. Scored as
    decode_check scores, each prompt once."""
    prompts = prompts[:len(reference.decode_tokens)]
    new = reference.decode_top_ids.shape[1]

    def request(i: int) -> Request:
        return Request(prompts[i], new, min_new_tokens=new, eos_token_id=eos_token_id,
                       forced_ids=tuple(reference.decode_tokens[i]))

    def greedy_ids(chunk: list[int]) -> list[list[int]]:
        done: dict[int, Completion] = {}
        rest = list(chunk)
        for size in sorted({1, *runner.buckets}):  # a lone prompt too, where no bucket is of one row
            if len(rest) <= size:
                break  # what is left arrives a step apart
            group, rest = rest[:size], rest[size:]
            done.update(zip(group, runner.run([request(i) for i in group])))
        for i in rest:
            done[i] = runner.submit(request(i))
            runner.step()
        while runner.num_waiting or runner.num_running:
            runner.step()
        return [done[i].greedy_ids for i in chunk]

    return staged_decode(len(prompts), reference, tie_epsilon, min_agreement, stage, greedy_ids)


def staged_decode(num_prompts: int, reference: Reference, tie_epsilon: float, min_agreement: float, stage: int,
                  greedy_ids: Callable[[list[int]], list[list[int]]]) -> dict:
    """The decode check's stages and verdict, whichever engine decodes: `greedy_ids(chunk)` runs the prompts of
    those indices teacher-forced on the reference's continuation and returns each one's greedy choices (the first
    from the prefill, not scored). Stages of `stage` prompts until the verdict is decided or all are used."""
    new = reference.decode_top_ids.shape[1]
    scored = new - 1
    cap = scored * num_prompts
    raw = tie = positions = used = 0
    first_miss: int | None = None
    prompt_misses: list[int] = []  # the prompt is the independent unit (autotune/gate/verdict.py)
    while True:
        chunk = list(range(used, min(used + stage, num_prompts)))
        for i, ids in zip(chunk, greedy_ids(chunk)):
            same, agree = agreeing(torch.tensor(ids[1:]), reference.decode_top_ids[i, 1:],
                                   reference.decode_top_logprobs[i, 1:], tie_epsilon)
            raw += int(same.sum())
            tie += int(agree.sum())
            misses = (~agree).nonzero()
            prompt_misses.append(len(misses))
            if len(misses):
                first_miss = min(int(misses[0]) + 1, first_miss if first_miss is not None else new)
        used += len(chunk)
        positions += scored * len(chunk)
        effect = float(design_effect(prompt_misses, scored))
        verdict = judge(tie, positions, min_agreement, cap_positions=cap, effect=effect)
        if verdict is not None:
            break
    return {"decode_agreement": tie / positions, "decode_raw_agreement": raw / positions,
            "decode_positions": positions, "decode_prompts": used, "decode_interval": [verdict.low, verdict.high],
            "decode_passed": verdict.passed, "decode_decided": verdict.decided, "decode_verdict": verdict.reason,
            "decode_first_miss": first_miss, "decode_design_effect": round(effect, 4)}
