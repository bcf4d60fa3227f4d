"""Evaluation episodes as GIFs a person can read without the JSONL beside them.

Each observation is enlarged by a whole factor (nearest neighbour, so grid squares stay crisp) to
at least `MIN_SIDE` pixels on its short side. A caption band under the image, so the picture is
never covered, says what happened: "start" on the first frame, then "turn 3/15  action: left
(wall bump)" for each turn, and on the last frame how the episode ended ("success: reached the
goal, reward 1.0", "failure: stopped off the goal", "failure: turn limit", ...), which stays on
screen longer. Text is drawn with Pillow's built-in font, unantialiased, so frames keep few colours.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from envs.actions import DIRECTION_NAMES, parse_action
from rlfw.rollout.types import Episode

MIN_SIDE = 256
"""Short side of a GIF's image, in pixels, at least."""
FONT_SIZE = 14
FRAME_MS = 600
"""How long each turn stays on screen."""
LAST_FRAME_MS = 2500
"""How long the final frame (the outcome) stays on screen."""
_LINE_PX = FONT_SIZE + 6
_BAND = (32, 32, 32)
_TEXT = (235, 235, 235)
_WIN, _LOSS = (110, 220, 110), (255, 120, 110)
_ACTION_NAMES = (*DIRECTION_NAMES, "stop")


@dataclass
class TurnNote:
    """What the env reported about one turn (its `info` flags and whether the turn ended the episode)."""

    invalid_action: bool = False
    wall_bump: bool = False
    terminated: bool = False
    truncated: bool = False


def action_label(reply: str, note: TurnNote) -> str:
    """The move a reply names ("left", "stop"); an invalid reply quoted (escapes shown), another
    env's action as it is."""
    if note.invalid_action:
        return f"invalid {_shorten(repr(reply))}"
    index = parse_action(reply, "visgym")
    index = parse_action(reply, "tagged") if index is None else index
    return _shorten(reply.strip()) if index is None else _ACTION_NAMES[index]


def _shorten(text: str, n: int = 20) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


def outcome(episode: Episode, last: TurnNote | None) -> str:
    """How the episode ended, in words, with its reward."""
    reward = f"reward {episode.reward:.1f}"
    if episode.success:
        return f"success: reached the goal, {reward}"
    if last is not None and last.terminated:
        return f"failure: stopped off the goal, {reward}"
    if episode.truncated_by_tokens:
        return f"failure: token limit, {reward}"
    return f"failure: turn limit, {reward}"


def captions(episode: Episode, notes: list[TurnNote], max_turns: int) -> list[list[str]]:
    """The caption lines of every frame: "start", then one per turn; the outcome goes on the last."""
    lines = [["start"]]
    for turn, (reply, note) in enumerate(zip(episode.actions, notes), start=1):
        effect = "  (wall bump)" if note.wall_bump else ""
        lines.append([f"turn {turn}/{max_turns}  action: {action_label(reply, note)}{effect}"])
    lines[-1].append(outcome(episode, notes[-1] if notes else None))
    return lines


def annotate(frame: np.ndarray, lines: list[str], success: bool) -> Image.Image:
    """`frame` enlarged to at least MIN_SIDE pixels, with a two-line caption band under it; a second
    line is the outcome, green for a success and red otherwise."""
    h, w = frame.shape[:2]
    k = -(-MIN_SIDE // min(h, w))  # ceil: a whole factor, so every pixel becomes a k x k block
    image = Image.fromarray(np.ascontiguousarray(frame[..., :3])).resize((w * k, h * k), Image.NEAREST)
    out = Image.new("RGB", (w * k, h * k + 2 * _LINE_PX + 6), _BAND)
    out.paste(image, (0, 0))
    draw = ImageDraw.Draw(out)
    draw.fontmode = "1"  # no antialiasing: crisp text, and few colours for the GIF palette
    font = ImageFont.load_default(size=FONT_SIZE)
    for i, text in enumerate(lines):
        colour = (_WIN if success else _LOSS) if i == 1 else _TEXT
        while draw.textlength(text, font=font) > w * k - 12:  # cut what would run off the band
            text = text[:-4] + "..."
        draw.text((6, h * k + 4 + i * _LINE_PX), text, fill=colour, font=font)
    return out


def write_gif(episode: Episode, notes: list[TurnNote], max_turns: int, path: Path) -> None:
    """One frame per observation (turns + 1), captioned; the last one held for LAST_FRAME_MS."""
    texts = captions(episode, notes, max_turns)
    frames = [annotate(f, lines, episode.success) for f, lines in zip(episode.frames, texts)]
    n = len(frames)
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=[FRAME_MS] * (n - 1) + [LAST_FRAME_MS],
                   loop=0, optimize=True)
