"""Fast numpy renderer for grid environments: a static background per layout, one agent sprite.

A frame is ``rows*cell_px`` by ``cols*cell_px`` RGB pixels: white floor, gray walls as full squares,
the target as a full square in its colour, and the agent as a blue disc of radius ``cell_px / 4``
(VisGym's proportions) centred in its square. Below 4 px per cell the radius is raised to 1 px so
the disc still covers the centre of the square and stays visible; at 2 px it fills the square.
When the agent stands on the target the disc is drawn over the target square, whose corners stay
visible. Rendering a frame is one array copy plus one ``cell_px``-square assignment.
"""

from __future__ import annotations

import functools

import numpy as np

WHITE = (255, 255, 255)
GRAY = (169, 169, 169)
RED = (255, 0, 0)
GREEN = (0, 160, 0)
BLUE = (0, 0, 255)


@functools.lru_cache(maxsize=64)
def agent_mask(cell_px: int) -> np.ndarray:
    """Boolean ``cell_px`` x ``cell_px`` disc: pixel centres within the radius of the centre."""
    radius = max(cell_px / 4, 1.0)
    offsets = np.arange(cell_px) + 0.5 - cell_px / 2
    mask = offsets[:, None] ** 2 + offsets[None, :] ** 2 <= radius**2
    mask.flags.writeable = False
    return mask


class GridRenderer:
    """Draws frames of one maze (walls and target); build it once per maze, call `frame` per step."""

    def __init__(self, walls: np.ndarray, target: tuple[int, int], cell_px: int, target_rgb=RED):
        self.cell_px = cell_px
        colours = np.where(walls[..., None], np.uint8(GRAY), np.uint8(WHITE)).astype(np.uint8)
        colours[target] = target_rgb
        self.background = np.repeat(np.repeat(colours, cell_px, axis=0), cell_px, axis=1)
        mask = agent_mask(cell_px)
        self._sprite_on_floor = np.empty((cell_px, cell_px, 3), np.uint8)
        self._sprite_on_floor[:] = WHITE
        self._sprite_on_floor[mask] = BLUE
        self._sprite_on_target = np.empty_like(self._sprite_on_floor)
        self._sprite_on_target[:] = target_rgb
        self._sprite_on_target[mask] = BLUE
        self._target = tuple(target)

    def frame(self, agent: tuple[int, int]) -> np.ndarray:
        """A new ``H x W x 3`` uint8 array with the agent drawn at `agent`."""
        img = self.background.copy()
        r, c = agent[0] * self.cell_px, agent[1] * self.cell_px
        on_target = tuple(agent) == self._target
        img[r : r + self.cell_px, c : c + self.cell_px] = (
            self._sprite_on_target if on_target else self._sprite_on_floor
        )
        return img
