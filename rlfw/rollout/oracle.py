"""Oracle labels on the states the policy visits: a DAgger-style supervised term (`algo.oracle_coef`).

GRPO's remaining maze errors are confident ones (the oracle's move under 5% at a junction), so
sampling stops trying the right move and the outcome reward cannot correct it. The env's oracle
can: the agent loop records, at every turn, the env's `best_action()` at the state the policy saw
(`Episode.oracle_actions`, taken before the env steps) beside the action the env parsed from the
reply (`Episode.parsed_actions`). `oracle_targets` turns the turns that `algo.oracle_states`
chooses (`ORACLE_STATES`) into training segments: the turn's own prompt tokens, then the oracle's
action and EOS as the only loss tokens, as `rlfw.rollout.demos.to_segment` builds a demonstration. The update
(`rlfw.policy.PolicyTrainer`) adds `oracle_coef` times their mean token negative log-likelihood,
weighted per segment by the kind of state it labels (`oracle_weights`, `algo.oracle_tag_weights`:
e.g. the maze's junctions above its corridors).

This is DAgger (Ross et al. 2011) on the policy's own states, with two deviations: no aggregation
across iterations (a step's labels train that step only), and the RL loss stays beside it. Needs
env.history=none: there each turn is one training sequence whose prompt is the state.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from rlfw.rollout.types import Episode, Segment

def _wrong(oracle: Optional[str], played: Optional[str]) -> bool:
    return oracle is not None and played != oracle


def _errors(e: Episode) -> list[int]:
    return [t for t, (o, p) in enumerate(zip(e.oracle_actions, e.parsed_actions)) if _wrong(o, p)]


ORACLE_STATES: dict[str, Callable[[Episode], list[int]]] = {
    "errors": _errors,
    "first_error": lambda e: _errors(e)[:1],
    "all": lambda e: [t for t, o in enumerate(e.oracle_actions) if o is not None],
}
"""`algo.oracle_states` -> the turns of an episode that get a label: errors = every turn where the
policy's move differed from the oracle's (an invalid reply counts); first_error = only the first
such turn (the state where a greedy policy goes wrong; later ones are off its path); all = every
labelled turn."""


def answer_segment(processor, prompt_ids: list[int], images: Sequence[np.ndarray], action: str) -> Segment:
    """`prompt_ids` followed by `action` and EOS, which alone carry loss (`rlfw.rollout.demos.to_segment`'s layout)."""
    answer = processor.tokenizer.encode(action, add_special_tokens=False) + [processor.eos_token_id]
    ids = list(prompt_ids) + answer
    return Segment(ids, [0] * len(prompt_ids) + [1] * len(answer), [0.0] * len(ids), list(images))


def oracle_targets(episodes: list[Episode], processor, states: str,
                   tag_states: Sequence[str] = ()) -> tuple[list[Segment], list[int], list]:
    """The oracle segments [K] of the turns `states` chooses, and of every labelled turn whose state
    tag is in `tag_states` (`algo.oracle_tag_states`), their episodes' task groups [K] and the state
    tags of those turns [K] (`Episode.state_tags`; None where the env has none). Turn t of an
    episode is its segment t (env.history=none); its prompt is everything before the generated tokens."""
    chosen = ORACLE_STATES[states]
    segments, groups, tags = [], [], []
    for e in episodes:
        tagged = {t for t, tag in enumerate(e.state_tags)
                  if tag in tag_states and t < len(e.oracle_actions) and e.oracle_actions[t] is not None}
        for t in sorted(set(chosen(e)) | tagged):
            seg = e.segments[t]
            prompt = len(seg.token_ids) - sum(seg.loss_mask)
            segments.append(answer_segment(processor, seg.token_ids[:prompt], seg.images, e.oracle_actions[t]))
            groups.append(e.group_id)
            tags.append(e.state_tags[t] if t < len(e.state_tags) else None)
    return segments, groups, tags


def oracle_weights(tags: Sequence[Optional[str]], tag_weights: dict[str, float]) -> list[float]:
    """Each label's weight in the oracle term (`algo.oracle_tag_weights`): its tag's, 1 for a tag
    the mapping does not name or a label without one."""
    return [float(tag_weights.get(tag, 1.0)) if tag is not None else 1.0 for tag in tags]


def oracle_metrics(episodes: list[Episode], used: int) -> dict[str, float]:
    """`train/oracle_disagreement` (share of labelled turns where the parsed move was not the
    oracle's) and `train/oracle_states` (labelled turns the oracle term used); nothing for an env
    without an oracle."""
    labelled = [(o, p) for e in episodes for o, p in zip(e.oracle_actions, e.parsed_actions) if o is not None]
    if not labelled:
        return {}
    return {"train/oracle_disagreement": float(np.mean([o != p for o, p in labelled])),
            "train/oracle_states": float(used)}
