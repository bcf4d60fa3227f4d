"""Training never meets an evaluation maze: disjoint seeds are not enough (the easy generator has
only about 10^5 mazes), so SFT and GRPO skip every layout in `envs.eval_sets.reserved_keys`."""

from rlfw.build import make_env_fn, training_filter
from rlfw.config import MazeEnvConfig
from rlfw.rollout.demos import DemoSampler
from rlfw.train import training_tasks

EVAL64_TWIN = 1008444   # a training seed whose maze is one of eval64's
HELDOUT_TWIN = 1000635  # a training seed whose maze is among the first held-out layouts


def test_filter_rejects_training_seeds_whose_maze_is_an_evaluation_maze():
    allowed = training_filter(MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0"))
    assert not allowed(EVAL64_TWIN) and not allowed(HELDOUT_TWIN)
    assert allowed(EVAL64_TWIN + 1) and allowed(HELDOUT_TWIN + 1)


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
    seeds = [sampler._seed() for _ in range(20)]
    assert all(s % 3 == 0 for s in seeds) and len(seen) > len(seeds)
