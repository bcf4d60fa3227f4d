"""Fresh oracle states in GRPO's oracle term (`algo.oracle_fresh_states`): SFT's all_squares states of
fresh training mazes, added after the visited ones, dealt to the step's groups in turn, and drawn
from (seed, step) alone."""

from pathlib import Path

import numpy as np
import pytest
import torch

from rlfw.build import make_env_fn, training_filter
from rlfw.config import AlgoConfig, repo_root
from rlfw.models.processing import PolicyProcessor
from rlfw.rollout.demos import DemoSampler
from rlfw.rollout.types import Episode, Segment, Task
from rlfw.train import fresh_sampler, fresh_segments, train_batch
from rlfw.validation import ConfigError
from tests.rlfw.inprocess import compose_config, train_rows

SFT = f"{repo_root()}/checkpoints/tiny_vl_maze_sft"


def _episode(group: int, oracle: list[str], played: list[str]) -> Episode:
    e = Episode(task=Task(seed=group), group_id=group)
    for t, (o, p) in enumerate(zip(oracle, played)):
        e.segments.append(Segment([100 + t, 7, 8], [0, 0, 1], [0.0] * 3, []))
        e.oracle_actions.append(o)
        e.parsed_actions.append(p)
    return e


def test_fresh_states_follow_the_visited_ones_and_are_dealt_to_the_groups_in_turn():
    processor = PolicyProcessor.from_pretrained(SFT)
    episodes = [_episode(5, ["up", "left"], ["down", "left"]), _episode(2, ["up"], ["up"]),
                _episode(9, ["right", "up"], ["right", "left"])]
    fresh = [Segment([200 + i, 8], [0, 1], [0.0, 0.0], []) for i in range(7)]
    algo = AlgoConfig(oracle_coef=1.0, oracle_states="first_error")
    batch = train_batch(episodes, torch.zeros(3), algo, processor, fresh)
    visited = [s for s in batch.oracle if s.token_ids[0] < 200]
    assert [s.token_ids[0] for s in visited] == [100, 101]  # group 5's turn 0, group 9's turn 1
    assert batch.oracle[2:] == fresh
    assert batch.oracle_groups == [5, 9] + [2, 5, 9, 2, 5, 9, 2]
    # without the oracle term there is no oracle batch at all, fresh or not
    assert train_batch(episodes, torch.zeros(3), AlgoConfig(), processor, fresh).oracle == []


def test_a_steps_fresh_states_depend_on_its_seed_alone():
    processor = PolicyProcessor.from_pretrained(SFT)
    env_cfg = compose_config(Path("unused"), "env=maze").env
    demos = DemoSampler(make_env_fn(env_cfg, processor.crop_px), 0, "all_squares", 0.0, training_filter(env_cfg))
    first = fresh_segments(demos, processor, 6, seed=123)
    demos.sample(5)  # the stream moves on; a seeded draw does not care
    again = fresh_segments(demos, processor, 6, seed=123)
    other = fresh_segments(demos, processor, 6, seed=124)
    assert [s.token_ids for s in first] == [s.token_ids for s in again]
    assert all(np.array_equal(a.images[0], b.images[0]) for a, b in zip(first, again))
    assert [s.token_ids for s in first] != [s.token_ids for s in other]
    for s in first:  # an SFT demonstration: the turn's prompt, then the oracle's move and EOS
        answer = [t for t, m in zip(s.token_ids, s.loss_mask) if m]
        assert answer[-1] == processor.eos_token_id and len(answer) >= 2
        assert s.images[0].shape[:2] == tuple(processor.observation_px)
    assert fresh_segments(None, processor, 6, seed=1) == [] and fresh_segments(demos, processor, 0, seed=1) == []


def test_fresh_junction_states_are_junctions_labelled_with_the_oracles_move():
    """algo.oracle_fresh_junction_fraction reaches the run's sampler: at 1 every fresh state is a
    junction labelled with the oracle's move there; at 0 the draw is the plain one; with no fresh
    states there is no sampler."""
    from tests.envs.helpers import labelled_draws

    env_cfg = compose_config(Path("unused"), "env=maze").env
    make_env, allowed = make_env_fn(env_cfg), training_filter(env_cfg)

    def drawn(algo, n):
        return labelled_draws(fresh_sampler(algo, make_env, 0, allowed), n)

    junctions = drawn(AlgoConfig(oracle_coef=1, oracle_fresh_states=4, oracle_fresh_junction_fraction=1.0), 60)
    assert all(junction and action == oracle for junction, _, action, oracle, _ in junctions)
    plain = drawn(AlgoConfig(oracle_coef=1, oracle_fresh_states=4), 60)
    direct = labelled_draws(DemoSampler(make_env, 0, "all_squares", 0.0, allowed), 60)
    assert all(a[1:4] == b[1:4] and np.array_equal(a[4], b[4]) for a, b in zip(plain, direct))
    assert np.mean([junction for junction, *_ in plain]) < 0.2
    assert fresh_sampler(AlgoConfig(oracle_coef=1, oracle_fresh_junction_fraction=1.0), make_env, 0, allowed) is None


def test_bad_fresh_state_settings_are_refused_before_anything_runs(tmp_path):
    for overrides, needle in [(["algo.oracle_fresh_states=8"], "only with algo.oracle_coef > 0"),
                              (["algo.oracle_coef=1", "algo.oracle_fresh_states=-1"], "must be >= 0"),
                              (["algo.oracle_coef=1", "algo.oracle_fresh_states=8",
                                "algo.oracle_fresh_junction_fraction=1.5"], r"must be in \[0, 1\]"),
                              (["algo.oracle_coef=1", "algo.oracle_fresh_junction_fraction=0.5"],
                               "applies to algo.oracle_fresh_states > 0 only"),
                              (["algo.oracle_coef=1", "algo.oracle_fresh_states=8", "algo.oracle_fresh_from=1"],
                               r"must be in \[0, 1\)"),
                              (["algo.oracle_coef=1", "algo.oracle_fresh_from=0.5"],
                               "oracle_fresh_from applies to algo.oracle_fresh_states > 0 only")]:
        with pytest.raises(ConfigError, match=needle):
            compose_config(tmp_path, "experiment=debug", *overrides)


def test_a_run_with_fresh_states_trains_on_them_and_logs_them(tmp_path):
    rows = train_rows(tmp_path / "run", "algo.oracle_coef=0.5", "algo.oracle_states=first_error",
                      "algo.oracle_fresh_states=5")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["train/oracle_fresh_states"] == 5
        assert 5 <= r["train/oracle_states"] <= 5 + r["train/episodes"]  # at most one first error each
        assert r["policy/oracle_loss"] > 0


def test_fresh_states_join_from_oracle_fresh_from(tmp_path):
    """algo.oracle_fresh_from=0.5 of a two-step run: step 1 (none of the run done) trains on the visited
    states alone, step 2 (half done) adds its fresh ones."""
    rows = train_rows(tmp_path / "run", "algo.oracle_coef=0.5", "algo.oracle_states=first_error",
                      "algo.oracle_fresh_states=5", "algo.oracle_fresh_from=0.5")
    assert [r["step"] for r in rows] == [1, 2]
    assert "train/oracle_fresh_states" not in rows[0] and rows[0]["train/oracle_states"] <= rows[0]["train/episodes"]
    assert rows[1]["train/oracle_fresh_states"] == 5
