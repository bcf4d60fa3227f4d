"""The action parser: canonical strings, tolerated variants, garbage, free text, never raising."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.actions import (
    ACTION_FORMATS,
    ACTION_STRINGS,
    TEXT_CHARSET,
    action_menu,
    invalid_action_feedback,
    parse_action,
    task_prompt,
)
from envs.grid_goal import GridGoalEnv
from envs.maze2d import Maze2DEnv


def test_canonical_strings():
    assert ACTION_STRINGS["visgym"] == (
        "('move', 0)",
        "('move', 1)",
        "('move', 2)",
        "('move', 3)",
        "('stop', 'stop')",
    )
    assert ACTION_STRINGS["tagged"][2] == "<action>left</action>"
    for fmt in ACTION_FORMATS:
        assert [parse_action(s, fmt) for s in ACTION_STRINGS[fmt]] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "text, index",
    [
        ('("move",0)', 0),
        ("(move, 1)", 1),
        ("(  'move' ,\n 2 )", 2),
        ("('Move', 3)", 3),
        ('("stop", "stop")', 4),
        ("(stop,stop)", 4),
        ("Reasoning: the target is up. Action: ('move', 1)", 1),
        ("('move', 0) no wait, ('move', 2). Final.", 2),  # the last action wins
        ("`('stop', 'stop')`", 4),
    ],
)
def test_visgym_variants(text, index):
    assert parse_action(text, "visgym") == index


@pytest.mark.parametrize(
    "text",
    [
        "",
        "move right",
        "('move', 4)",
        "('move', -1)",
        "('move', '0')",
        "('move', 01)",
        "('move', 0",
        "('move\", 0)",
        "('go', 0)",
        "('stop')",
        "('stop', 'go')",
        "<action>right</action>",
    ],
)
def test_visgym_garbage(text):
    assert parse_action(text, "visgym") is None


@pytest.mark.parametrize(
    "text, index",
    [
        ("<action>right</action>", 0),
        ("<action> Up </action>", 1),
        ("< action >LEFT</ action >", 2),
        ("I go <action>down</action>", 3),
        ("<action>up</action> then <action>stop</action>", 4),
    ],
)
def test_tagged_variants(text, index):
    assert parse_action(text, "tagged") == index


@pytest.mark.parametrize(
    "text", ["<action>jump</action>", "<action>right", "right", "('move', 0)", "<act>up</act>"]
)
def test_tagged_garbage(text):
    assert parse_action(text, "tagged") is None


@pytest.mark.parametrize("value", [None, b"('move', 0)", 0, ["('move', 0)"]])
def test_non_strings_parse_to_none(value):
    assert parse_action(value) is None


def test_unknown_format_names_valid_values():
    with pytest.raises(ValueError, match="visgym, tagged"):
        parse_action("('move', 0)", "json")


@settings(max_examples=300, deadline=None)
@given(text=st.text(), fmt=st.sampled_from(ACTION_FORMATS))
def test_never_raises_on_text(text, fmt):
    assert parse_action(text, fmt) in (None, 0, 1, 2, 3, 4)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=2000), fmt=st.sampled_from(ACTION_FORMATS))
def test_never_raises_on_binary_looking_text(data, fmt):
    for text in (data.decode("latin-1"), data.decode("utf-8", errors="surrogateescape")):
        assert parse_action(text, fmt) in (None, 0, 1, 2, 3, 4)


@settings(max_examples=200, deadline=None)
@given(
    prefix=st.text(),
    suffix=st.text(),
    index=st.integers(0, 4),
    fmt=st.sampled_from(ACTION_FORMATS),
)
def test_finds_action_inside_free_text(prefix, suffix, index, fmt):
    if parse_action(suffix, fmt) is None:
        assert parse_action(prefix + ACTION_STRINGS[fmt][index] + suffix, fmt) == index


def test_prompt_and_feedback_fit_the_text_space():
    texts = [invalid_action_feedback(f) for f in ACTION_FORMATS]
    texts += [Maze2DEnv(action_format=f).prompt() for f in ACTION_FORMATS]
    texts += [GridGoalEnv(action_format=f).prompt() for f in ACTION_FORMATS]
    for text in texts:
        assert set(text) <= set(TEXT_CHARSET) and len(text) < 1000


def test_prompt_pieces():
    assert action_menu("visgym").splitlines()[0] == "('move', 0) = move right"
    prompt = task_prompt("Intro.", "red square", "tagged", 9)
    assert prompt.startswith("Intro. Each move goes one square.\n")
    assert "<action>stop</action> = stop (ends the episode)" in prompt
    assert "Success: stop while on the red square. You have 9 turns" in prompt
