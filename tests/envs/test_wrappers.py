"""The observation crop lives in the env, so every consumer of a policy gets the same pixels."""

import gymnasium as gym
import numpy as np
import pytest

import envs  # noqa: F401
from envs.wrappers import CropImage, crop_image
from rlfw.build import make_env_fn
from rlfw.config import MazeEnvConfig, repo_root
from rlfw.models.processing import PolicyProcessor

SHIPPED = f"{repo_root()}/checkpoints/tiny_vl_maze_sft"


def test_the_env_cuts_the_outer_wall_and_says_so_in_its_observation_space():
    raw = gym.make("rlfw/Maze2D-v0", cell_px=8)
    cropped = CropImage(gym.make("rlfw/Maze2D-v0", cell_px=8), 8)
    a, _ = raw.reset(seed=3)
    b, _ = cropped.reset(seed=3)
    assert a["image"].shape == (72, 72, 3) and b["image"].shape == (56, 56, 3)
    assert np.array_equal(b["image"], a["image"][8:-8, 8:-8]) and b["text"] == a["text"]
    assert np.all(a["image"][:8] == a["image"][0, 0])  # what is cut is the constant wall
    assert cropped.observation_space["image"].shape == (56, 56, 3)
    assert cropped.observation_space["image"].contains(b["image"])
    a2, *_ = raw.step("('move', 'right')")
    b2, *_ = cropped.step("('move', 'right')")
    assert np.array_equal(b2["image"], crop_image(a2["image"], 8))
    with pytest.raises(ValueError, match="leaves nothing"):
        CropImage(gym.make("rlfw/Maze2D-v0", cell_px=8), 36)


def test_the_policy_reads_the_env_image_as_it_is_and_refuses_an_uncropped_one():
    """The processor no longer crops: the pixels it encodes are the env's, which any endpoint
    client sends too. An uncropped observation is an error naming the fix, never a silent misread."""
    processor = PolicyProcessor.from_pretrained(SHIPPED)
    assert processor.crop_px == 8 and processor.observation_px == (56, 56)
    env_cfg = MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0")
    obs, _ = make_env_fn(env_cfg, processor.crop_px)().reset(seed=5)
    feats = processor.image_features(obs["image"])
    direct = processor.image_processor(images=[obs["image"]], return_tensors="pt")
    assert np.array_equal(feats.pixel_values.numpy(), direct["pixel_values"].numpy())
    assert processor.n_image_tokens(obs["image"]) == 49  # one token per square of the 7x7 interior
    raw, _ = make_env_fn(env_cfg)().reset(seed=5)
    with pytest.raises(ValueError, match=r"a 72x72 image; this policy reads 56x56 observations .*crop_px"):
        processor.image_features(raw["image"])
