"""Evaluation GIFs: enlarged with whole pixels, captioned under the image, one frame per
observation with the last held longer; and an evaluation's pictures reaching TensorBoard."""

import gymnasium as gym
import numpy as np
from PIL import Image

import envs  # noqa: F401  (registers rlfw/Maze2D-v0)
from rlfw.evaluate import _TurnRecorder
from rlfw.gifs import FRAME_MS, LAST_FRAME_MS, TurnNote, action_label, captions, outcome, write_gif
from rlfw.rollout.types import Episode, Task
from tests.rlfw.inprocess import compose_config, train_in_process

LEFT, STOP = "('move', 2)", "('stop', 'stop')"


def _play(replies: list[str], seed: int = 0, max_turns: int = 15) -> tuple[Episode, list[TurnNote]]:
    """An episode of the 72x72 maze played with `replies`, as the agent loop records it."""
    env = _TurnRecorder(gym.make("rlfw/Maze2D-v0", cell_px=8, max_turns=max_turns))
    obs, _ = env.reset(seed=seed)
    ep = Episode(task=Task(seed), group_id=0, frames=[obs["image"]])
    for reply in replies:
        obs, reward, terminated, truncated, info = env.step(reply)
        ep.actions.append(reply)
        ep.turns += 1
        ep.reward += reward
        ep.success = info["success"]
        ep.frames.append(obs["image"])
        if terminated or truncated:
            break
    return ep, env.notes


def _frames(path) -> tuple[list[np.ndarray], list[int]]:
    im = Image.open(path)
    frames, durations = [], []
    for i in range(im.n_frames):
        im.seek(i)
        frames.append(np.asarray(im.convert("RGB")))
        durations.append(im.info["duration"])
    return frames, durations


def test_gif_is_enlarged_captioned_and_holds_the_end(tmp_path):
    solve = gym.make("rlfw/Maze2D-v0", cell_px=8).unwrapped
    solve.reset(seed=0)
    ep, notes = _play([LEFT, *solve.solve()])  # seed 0 starts in the bottom-left corner: left bumps
    assert notes[0].wall_bump and not notes[1].wall_bump and ep.success
    write_gif(ep, notes, 15, tmp_path / "e.gif")
    frames, durations = _frames(tmp_path / "e.gif")

    assert len(frames) == ep.turns + 1
    assert durations[:-1] == [FRAME_MS] * ep.turns and durations[-1] == LAST_FRAME_MS
    side = 72 * 4  # the smallest whole factor that reaches 256 pixels
    assert frames[0].shape[1] == side and frames[0].shape[0] > side
    for obs, frame in zip(ep.frames, frames):  # nearest neighbour: each pixel a 4x4 block, exactly
        assert np.array_equal(frame[:side], obs.repeat(4, 0).repeat(4, 1))
    band = [f[side:] for f in frames]  # the caption band, under the maze
    background = band[0][0, 0]
    assert all((b != background).any() for b in band)  # every frame has text
    assert np.array_equal(frames[1][:side], frames[0][:side])  # the bump did not move the agent...
    assert not np.array_equal(band[1], band[0])  # ...but "turn 1 ... (wall bump)" replaced "start"
    assert not np.array_equal(band[2], band[1])  # another turn, another action
    second_line = slice(band[0].shape[0] // 2, None)
    assert [bool((b[second_line] != background).any()) for b in band] == [False] * ep.turns + [True]  # outcome


def test_captions_name_the_turn_the_action_and_the_outcome():
    ep, notes = _play([LEFT, "<action>up</action>", "('move', 9)", "\n\n", STOP], seed=0, max_turns=15)
    assert captions(ep, notes, 15) == [
        ["start"],
        ["turn 1/15  action: left  (wall bump)"],
        ["turn 2/15  action: invalid '<action>up</acti..."],  # the maze reads visgym actions only
        ["turn 3/15  action: invalid \"('move', 9)\""],
        ["turn 4/15  action: invalid '\\n\\n'"],  # a blank reply, shown as such
        ["turn 5/15  action: stop", "failure: stopped off the goal, reward 0.0"],
    ]
    ep, notes = _play([LEFT] * 3, max_turns=3)
    assert outcome(ep, notes[-1]) == "failure: turn limit, reward 0.0" and notes[-1].truncated
    ep.truncated_by_tokens, notes[-1].truncated = True, False
    assert outcome(ep, notes[-1]) == "failure: token limit, reward 0.0"
    ep.success, ep.reward = True, 1.0
    assert outcome(ep, notes[-1]) == "success: reached the goal, reward 1.0"
    assert action_label("red", TurnNote()) == "red"  # another env's action, shown as it is


def test_an_evaluation_logs_its_gifs_and_the_pass_at_1_plot_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    cfg = compose_config(out, "experiment=debug", "logger.tensorboard=true", "logger.console=false")
    train_in_process(cfg)  # evaluates at steps 0 and 2, one GIF each
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    assert sorted(events.Tags()["images"]) == ["eval/maze/episode_000", "eval/pass_at_1_plot"]
    gifs, plots = events.Images("eval/maze/episode_000"), events.Images("eval/pass_at_1_plot")
    assert [g.step for g in gifs] == [p.step for p in plots] == [0, 2]
    assert all(g.encoded_image_string.startswith(b"GIF8") and g.width >= 256 for g in gifs)
    assert all(p.encoded_image_string.startswith(b"\x89PNG") for p in plots)
    assert (out / "eval" / "step_000002" / "pass_at_1.png").exists()
