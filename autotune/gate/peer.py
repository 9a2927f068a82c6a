"""The accuracy gate on a peer engine's own logits (llama.cpp's, OpenVINO's): the same fp32 reference, windows,
decode prompts, scoring and verdicts as autotune's engine gets (autotune/gate/), only the candidate's logits and
greedy choices come from the peer's runner of the configuration being tried."""
from __future__ import annotations

import torch

from autotune.engine.peer import PeerRunner
from autotune.engine.sequence import Request
from autotune.gate.accuracy import score_windows  # the windows' scoring itself: one definition for every engine
from autotune.gate.decode import staged_decode
from autotune.gate.design import DECODE_STAGE_PROMPTS
from autotune.gate.reference import Reference
from autotune.gate.result import GateResult

__all__ = ["PeerRunner", "peer_decode_check", "peer_gate"]


def peer_gate(ctx: PeerRunner, reference: Reference, windows: list[list[int]], prompts: list[list[int]],
              *, tie_epsilon: float = 0.05, min_agreement: float = 0.995) -> GateResult:
    """Teacher-forced windows (each one sequence, every position's logits), stopped once a pass is out of reach;
    then the decode check through the runner (autotune/gate/accuracy.py's evaluate_gate, for a peer)."""
    figures, complete = score_windows(
        windows, ([(w, torch.from_numpy(ctx.all_logits(w)[:-1]))] for w in windows), reference, tie_epsilon,
        min_agreement)
    if not complete:
        return GateResult(**figures, stopped_early=True)
    if figures["tie_aware_agreement"] <= min_agreement:
        return GateResult(**figures)
    return GateResult(**figures, **peer_decode_check(ctx, reference, prompts, tie_epsilon, min_agreement))


def peer_decode_check(ctx: PeerRunner, reference: Reference, prompts: list[list[int]], tie_epsilon: float,
                      min_agreement: float, stage: int = DECODE_STAGE_PROMPTS) -> dict:
    """autotune/gate/decode.py's check through the peer's decode path: each stage's prompts run together through
    its continuous batching (as served), the reference's continuation forced, the greedy choice at every decode
    step scored; staged until the verdict is decided."""
    prompts = prompts[:len(reference.decode_tokens)]
    new = reference.decode_top_ids.shape[1]

    def greedy_ids(chunk: list[int]) -> list[list[int]]:
        outs = ctx.run([Request(prompts[i], new, min_new_tokens=new, forced_ids=tuple(reference.decode_tokens[i]))
                        for i in chunk])
        return [out.greedy_ids for out in outs]

    return staged_decode(len(prompts), reference, tie_epsilon, min_agreement, stage, greedy_ids)
