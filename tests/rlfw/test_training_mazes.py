"""Training never meets an evaluation maze: disjoint seeds are not enough (the easy generator has
only about 10^5 mazes), so SFT and GRPO skip every layout in `envs.eval_sets.reserved_keys`."""

import numpy as np

from rlfw.build import make_env_fn, training_filter
from rlfw.config import MazeEnvConfig
from rlfw.rollout.demos import DemoSampler
from rlfw.train import training_tasks

EVAL64_TWIN = 1008444   # a training seed whose maze is one of eval64's
HELDOUT_TWIN = 1000635  # a training seed whose maze is among the first held-out layouts


def test_filter_rejects_training_seeds_whose_maze_is_an_evaluation_maze():
    env_cfg = MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0")
    allowed, env = training_filter(env_cfg), make_env_fn(env_cfg)()
    assert not allowed(EVAL64_TWIN) and not allowed(HELDOUT_TWIN)
    assert allowed(EVAL64_TWIN + 1) and allowed(HELDOUT_TWIN + 1)
    for seed in (EVAL64_TWIN, HELDOUT_TWIN, EVAL64_TWIN + 1, HELDOUT_TWIN + 1):
        env.reset(seed=seed)
        assert allowed.admits(env.unwrapped.layout()) == allowed(seed)  # the layout judged in hand


def test_training_tasks_replace_rejected_seeds_deterministically():
    plain = training_tasks(0, 3, 0, 16)
    assert training_tasks(0, 3, 0, 16, lambda s: True) == plain  # nothing rejected: the same draw
    even = training_tasks(0, 3, 0, 16, lambda s: s % 2 == 0)
    assert len(even) == 16 and all(t.seed % 2 == 0 for t in even)
    assert even == training_tasks(0, 3, 0, 16, lambda s: s % 2 == 0)  # a resumed run draws the same
    kept = [t for t in plain if t.seed % 2 == 0]
    assert [t for t in even if t in kept] == kept  # allowed seeds keep their places


def test_demonstrations_skip_rejected_mazes():
    make_env = make_env_fn(MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0"))
    seen = []
    sampler = DemoSampler(make_env, seed=0, mode="all_squares", noise=0.0,
                          allowed=lambda s: seen.append(s) or s % 3 == 0)
    seeds = [sampler._reset()[0] for _ in range(20)]
    assert all(s % 3 == 0 for s in seeds) and len(seen) > len(seeds)


def test_demonstrations_generate_each_maze_once_and_draw_as_with_a_seed_filter():
    """Given training_filter's filter, the sampler judges the maze it generated itself (`admits`)
    instead of asking the filter's probe env to generate it again: the filter's own env is never
    reset, and the states are those a plain seed filter with the same verdicts draws (these 96 mazes
    may all be admitted: the next test makes the in-hand path reject)."""
    env_cfg = MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0")
    make_env, allowed = make_env_fn(env_cfg), training_filter(env_cfg)
    asked = []
    as_seeds = DemoSampler(make_env, 5, "all_squares", 0.0, lambda s: asked.append(s) or allowed(s), 0.5).sample(96)
    probe_resets = []
    allowed._probe.reset = lambda **kw: probe_resets.append(kw)
    in_hand = DemoSampler(make_env, 5, "all_squares", 0.0, allowed, 0.5).sample(96)
    assert probe_resets == [] and len(asked) >= 96
    assert all(a[1:] == b[1:] and np.array_equal(a[0], b[0]) for a, b in zip(as_seeds, in_hand, strict=True))


def test_a_layout_filter_rejects_the_maze_in_hand():
    """The in-hand path rejects too: reserving the layouts of every other maze a sampler draws makes
    the filtered sampler, from the same seed, keep exactly the others."""
    from envs.eval_sets import layout_key
    from rlfw.build import TrainingFilter

    make_env = make_env_fn(MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0"))
    plain = DemoSampler(make_env, 5, "all_squares", 0.0)
    first = [plain._reset() for _ in range(6)]
    reserved = frozenset(layout_key(layout) for _, _, layout in first[::2])
    filtered = DemoSampler(make_env, 5, "all_squares", 0.0, TrainingFilter(make_env().unwrapped, reserved))
    assert [filtered._reset()[0] for _ in range(3)] == [seed for seed, _, _ in first[1::2]]
