"""Restarts from the first wrong move (`algo.restart_fraction`, rlfw/rollout/restarts.py): a restart
is the state just before the first move that was not the oracle's, with the original's remaining
turns; the buffer is bounded, drawn by (seed, step, round), fed by training episodes only, and a
resumed run repeats the restarts of an uninterrupted one."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlfw.build import eval_tasks, make_env_fn, training_filter
from rlfw.rollout.restarts import StartStates, first_wrong_move
from rlfw.rollout.types import Task
from rlfw.train import training_tasks
from rlfw.validation import ConfigError
from tests.rlfw.inprocess import compose_config, train_in_process
from tests.rlfw.scripted import MAX_TURNS, build, first_wrong_at, play, replay

TASKS = [Task(seed=10**6 + i) for i in range(4)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    _, processor, make_env = build(tmp_path_factory.mktemp("m"))
    # episode i follows the oracle for i turns, then makes its first wrong move
    return processor, make_env, play(processor, make_env, TASKS, 1, first_wrong_at(lambda i: i))


def _starts(make_env, fraction=0.5, capacity=16, fresh=None):
    return StartStates(fresh or (lambda step, r, n: [Task(seed=step * 100 + r * 10 + i) for i in range(n)]),
                       make_env, seed=0, fraction=fraction, capacity=capacity, max_turns=MAX_TURNS)


def _state_after(make_env, task, actions):
    """(layout record, last feedback) after replaying `actions` from `task` on a fresh env."""
    env, _, feedback = replay(make_env, task, actions)
    return env.unwrapped.layout(), feedback


def test_a_restart_starts_at_the_square_before_the_first_wrong_move(setup):
    processor, make_env, episodes = setup
    starts = _starts(make_env)
    for i, e in enumerate(episodes):
        t = first_wrong_move(e)
        assert t == i and e.parsed_actions[:t] == e.oracle_actions[:t] and e.parsed_actions[t] != e.oracle_actions[t]
        restart = starts.restart_of(e, t)
        # replaying the episode's first t replies lands on the restart, feedback included
        assert _state_after(make_env, e.task, e.actions[:t]) == (restart.layout, restart.feedback)
        # ... and the states just before and after are not it
        for other in {max(t - 1, 0), t + 1} - {t}:
            assert _state_after(make_env, e.task, e.actions[:other]) != (restart.layout, restart.feedback)
        assert restart.max_turns == MAX_TURNS - t  # the original episode's remaining turns
        env = make_env()
        env.reset(**restart.reset_kwargs())
        assert env.unwrapped.best_action() == e.oracle_actions[t] != e.parsed_actions[t]
        # played from the restart, the first turn sees exactly the prompt the policy saw at turn t,
        # and the episode gets the remaining turns (the scripted policy never stops)
        again = play(processor, make_env, [restart], 2, first_wrong_at(lambda _: -1))
        for r in again:
            assert r.turns == MAX_TURNS - t
            p = len(e.segments[t].token_ids) - sum(e.segments[t].loss_mask)
            assert r.segments[0].token_ids[:p] == e.segments[t].token_ids[:p]
            assert (r.segments[0].images[0] == e.segments[t].images[0]).all()
        # a restart of a restart keeps counting from its own budget
        wrong_again = play(processor, make_env, [restart], 1, first_wrong_at(lambda _: 1))[0]
        assert starts.restart_of(wrong_again, 1).max_turns == MAX_TURNS - t - 1


def test_the_buffer_is_bounded_deduplicated_and_drawn_by_seed_step_and_round(setup):
    _, make_env, episodes = setup
    off = _starts(make_env, fraction=0.0)
    off.record(episodes)
    assert off.buffer == [] and off.tasks(3, 0, 4) == [Task(seed=300 + i) for i in range(4)] and off.metrics(episodes) == {}

    roomy = _starts(make_env)
    roomy.record(episodes)
    roomy.record(episodes)  # the same states again are not added twice
    assert [b.max_turns for b in roomy.buffer] == [MAX_TURNS - t for t in range(4)]
    starts = _starts(make_env, capacity=3)
    assert starts.tasks(1, 0, 4) == [Task(seed=100 + i) for i in range(4)]  # nothing to restart from yet
    starts.record(episodes)
    assert starts.buffer == roomy.buffer[1:]  # the newest 3
    tasks = starts.tasks(2, 1, 4)
    assert tasks[:2] == [Task(seed=210), Task(seed=211)]  # round(0.5 * 4) = 2 restarts after 2 fresh tasks
    assert len({json.dumps(t.layout) for t in tasks[2:]}) == 2 and all(t in starts.buffer for t in tasks[2:])
    assert starts.tasks(2, 1, 4) == tasks  # a function of (seed, step, round)
    assert {json.dumps(t.layout) for s in range(1, 20) for t in starts.tasks(s, 0, 4)[2:]} == \
        {json.dumps(b.layout) for b in starts.buffer}  # every state gets drawn
    restored = _starts(make_env, capacity=3)
    restored.load_state_dict(json.loads(json.dumps(starts.state_dict())))  # through the checkpoint's JSON
    assert restored.buffer == starts.buffer and restored.tasks(2, 1, 4) == tasks


def _history(out: Path, after: int = 0) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in r.items() if not k.startswith(("timing/", "memory/"))} for r in rows if r["step"] > after]
    return [r for r in rows if len(r) > 1]


def _buffer(out: Path, step: int) -> list[dict]:
    state = json.loads((out / "checkpoints" / f"global_step_{step}" / "trainer_state.json").read_text())
    return state["restarts"]["buffer"]


def test_restarts_repeat_on_resume_and_come_from_training_mazes_only(tmp_path):
    args = ["experiment=debug", "trainer.total_steps=4", "trainer.ckpt_interval=2", "trainer.max_ckpts_to_keep=0",
            "trainer.eval_interval=2", "algo.restart_fraction=0.5", "algo.restart_buffer_size=3"]
    runs = {name: tmp_path / name for name in ("a", "again", "resumed")}
    for name in ("a", "again"):
        train_in_process(compose_config(runs[name], *args))
    train_in_process(compose_config(runs["resumed"], *args, "trainer.resume_mode=from_path",
                                    f"trainer.resume_path={runs['a'] / 'checkpoints' / 'global_step_2'}"))
    a = runs["a"]
    assert [r.get("train/restart_groups") for r in _history(a) if "policy/loss" in r] == [0, 1, 1, 1]
    for step in (2, 4):
        assert _buffer(a, step) and _buffer(runs["again"], step) == _buffer(a, step)  # same seed, same restarts
    assert _buffer(runs["resumed"], 4) == _buffer(a, 4)
    assert _history(runs["again"]) == _history(a)
    assert _history(runs["resumed"]) == _history(a, after=2)
    final_a, final_resumed = (load_file(str(r / "lora_sync" / "v4" / "adapter_model.safetensors")) for r in (a, runs["resumed"]))
    assert all(torch.equal(final_a[k], final_resumed[k]) for k in final_a)

    # every restart is on a maze of this run's training tasks, none on an evaluation maze (the
    # greedy evaluations at steps 0, 2 and 4 make first wrong moves too)
    cfg = compose_config(a, *args)
    make_env = make_env_fn(cfg.env)
    allowed = training_filter(cfg.env)
    env = make_env()

    def maze(record):
        return tuple(record["grid"]), tuple(record["target"])

    trained = set()
    for step in range(1, 5):
        for task in training_tasks(cfg.seed, step, 0, cfg.algo.tasks_per_step, allowed):
            env.reset(seed=task.seed)
            trained.add(maze(env.unwrapped.layout()))
    evaluated = {maze(layout) for layout in eval_tasks(cfg.env)[1]}
    restarts = {maze(t["layout"]) for step in (2, 4) for t in _buffer(a, step)}
    assert restarts <= trained and not restarts & evaluated


@pytest.mark.parametrize("overrides, needle", [
    (["algo.restart_fraction=1.5"], "algo.restart_fraction=1.5 must be in"),
    (["algo.restart_buffer_size=0"], "algo.restart_buffer_size=0 must be >= 1"),
    (["algo.restart_fraction=0.25", "env.history=full"], "need env.history=none"),
])
def test_bad_restart_settings_are_refused_before_anything_runs(tmp_path, overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        compose_config(tmp_path, "experiment=debug", *overrides)
