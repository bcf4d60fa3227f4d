"""Wrappers every consumer of an rlfw env's observations can share.

`CropImage` cuts a border from each observation image. rlfw's maze policies are trained on the
maze without its constant outer wall (one grid square a side: fewer image tokens, same
information). Cutting it in the env's observation, not inside rlfw's processor, means every
consumer gets the same pixels: the in-process engines, vLLM, an OpenAI-compatible endpoint that
only ever sees the image it is sent, and a user's own client.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


def crop_image(image: np.ndarray, px: int) -> np.ndarray:
    """`image` with `px` pixels cut from each side."""
    return np.ascontiguousarray(image[px:-px, px:-px]) if px else image


class CropImage(gym.ObservationWrapper):
    """Observation images with `px` pixels cut from each side (`obs["image"][px:-px, px:-px]`)."""

    def __init__(self, env: gym.Env, px: int):
        super().__init__(env)
        if px < 0:
            raise ValueError(f"crop of {px} px: must be >= 0")
        self.px = px
        space = env.observation_space
        if px and isinstance(space, spaces.Dict) and isinstance(space.spaces.get("image"), spaces.Box):
            box = space["image"]
            h, w = box.shape[:2]
            if min(h, w) <= 2 * px:
                raise ValueError(f"crop of {px} px a side leaves nothing of a {h}x{w} image")
            self.observation_space = spaces.Dict({**space.spaces, "image": spaces.Box(
                0, 255, (h - 2 * px, w - 2 * px, *box.shape[2:]), dtype=box.dtype)})

    def observation(self, obs: dict) -> dict:
        if not self.px:
            return obs
        return {**obs, "image": crop_image(obs["image"], self.px)}
