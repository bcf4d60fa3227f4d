"""Text actions shared by the rlfw grid environments: canonical strings, the parser, feedback.

An action is one of five moves, indexed 0 right, 1 up, 2 left, 3 down, 4 stop (VisGym's
``('move', d)`` numbering, with stop appended). Two textual formats exist:

- ``"visgym"``: ``('move', 0)`` ... ``('move', 3)`` and ``('stop', 'stop')``.
- ``"tagged"``: ``<action>right</action>`` ... ``<action>stop</action>``.

`parse_action` finds the LAST well-formed action anywhere in a model's free text. It tolerates
whitespace, letter case and quote style (``('move', 0)``, ``("move",0)``, ``(move, 0)``), but not
other garbage (``('move', 4)``, ``('move', '0')``, ``move 0``). It never raises: anything that is
not a ``str`` (or contains no action) parses to ``None``.

The prompt pieces and feedback strings are module constants or small functions so that a trainer
can show a model the same text the environments produce.
"""

from __future__ import annotations

import re
import string

RIGHT, UP, LEFT, DOWN, STOP = range(5)
DIRECTION_NAMES = ("right", "up", "left", "down")
# (row delta, col delta) for each move index; row 0 is the top of the image.
DELTAS = ((0, 1), (-1, 0), (0, -1), (1, 0))

ACTION_FORMATS = ("visgym", "tagged")
ACTION_STRINGS = {
    "visgym": ("('move', 0)", "('move', 1)", "('move', 2)", "('move', 3)", "('stop', 'stop')"),
    "tagged": tuple(f"<action>{w}</action>" for w in (*DIRECTION_NAMES, "stop")),
}

# Every character of every prompt and feedback string; the Text observation space uses it.
TEXT_CHARSET = string.printable

WALL_FEEDBACK = "Cannot move into a wall."
MOVED_FEEDBACK = "Moved {direction}."
STOP_ON_TARGET_FEEDBACK = "Stopped on the target."
STOP_OFF_TARGET_FEEDBACK = "Stopped, but not on the target."
OUT_OF_TURNS_FEEDBACK = "Out of turns."

_Q = r"""(['"]?)"""  # optional quote; a back-reference makes the closing quote match it
_PATTERNS = {
    "visgym": re.compile(
        rf"\(\s*{_Q}move\1\s*,\s*([0-3])\s*\)"
        rf"|\(\s*{_Q}stop\3\s*,\s*{_Q}stop\4\s*\)",
        re.IGNORECASE,
    ),
    "tagged": re.compile(
        r"<\s*action\s*>\s*(right|up|left|down|stop)\s*<\s*/\s*action\s*>", re.IGNORECASE
    ),
}
_TAG_INDEX = {w: i for i, w in enumerate((*DIRECTION_NAMES, "stop"))}


def check_action_format(action_format: str) -> None:
    """Raise ValueError naming the valid formats when `action_format` is not one of them."""
    if action_format not in ACTION_FORMATS:
        raise ValueError(
            f"unknown action_format {action_format!r}; valid values: {', '.join(ACTION_FORMATS)}"
        )


def parse_action(text: object, action_format: str = "visgym") -> int | None:
    """Index (0 right, 1 up, 2 left, 3 down, 4 stop) of the last well-formed action in `text`.

    Returns None when `text` is not a str or holds no well-formed action. Never raises for any
    `text`; raises ValueError only for an unknown `action_format`.
    """
    pattern = _PATTERNS.get(action_format)
    if pattern is None:
        check_action_format(action_format)
    if not isinstance(text, str):
        return None
    last = None
    for last in pattern.finditer(text):
        pass
    if last is None:
        return None
    if action_format == "tagged":
        return _TAG_INDEX[last.group(1).lower()]
    digit = last.group(2)
    return STOP if digit is None else int(digit)


def action_menu(action_format: str) -> str:
    """The lines of the prompt that list the actions, one per line, in canonical form."""
    check_action_format(action_format)
    names = [f"move {d}" for d in DIRECTION_NAMES] + ["stop (ends the episode)"]
    return "\n".join(f"{s} = {n}" for s, n in zip(ACTION_STRINGS[action_format], names))


def invalid_action_feedback(action_format: str) -> str:
    """Feedback for a reply with no well-formed action: says which strings are expected."""
    check_action_format(action_format)
    strings = ACTION_STRINGS[action_format]
    if action_format == "visgym":
        choices = ", ".join(f"{s} {n}" for s, n in zip(strings, DIRECTION_NAMES))
        return f"Invalid action. Expected one of: {choices}, {strings[STOP]}."
    return f"Invalid action. Expected one of: {', '.join(strings)}."


def task_prompt(intro: str, target_name: str, action_format: str, max_turns: int) -> str:
    """Task prompt shared by the grid environments: `intro`, the action menu, the success rule."""
    return (
        f"{intro} Each move goes one square.\n"
        f"Actions (reply with exactly one):\n{action_menu(action_format)}\n"
        f"Success: stop while on the {target_name}. You have {max_turns} turns; "
        "bumping into a wall or an invalid action also uses a turn."
    )
