"""Turn chat messages and images into the token ids and pixel tensors a Qwen-VL policy reads.

`PolicyProcessor` pairs a tokenizer (with a chat template) and a Qwen2-VL-style image processor,
the two pieces every Qwen2/2.5/3-VL checkpoint ships. It renders each message on its own, so a
conversation's ids are the concatenation of its messages' ids: the multi-turn rollout appends a
turn's ids to what the model already saw and generated (token in, token out), and training sees
exactly the tokens that were sampled, never a re-tokenisation of decoded text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil


RLFW_PROCESSOR_FILE = "rlfw_processor.json"  # rlfw's own processor settings beside the HF files
_TEXT_CACHE_SIZE = 4096  # texts whose ids PolicyProcessor keeps (see _encode_text)


@dataclass
class ImageFeatures:
    """Vision-tower input for one image."""

    pixel_values: torch.Tensor  # [n_patches, C * temporal * patch * patch]
    grid_thw: torch.Tensor  # [3]: temporal, height, width in patches


class PolicyProcessor:
    """Tokenizer + image processor with message-at-a-time encoding (see module docstring)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, image_processor: Qwen2VLImageProcessorPil,
                 crop_px: int = 0, observation_px: tuple[int, int] | None = None):
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        # The policy's observation contract, saved in rlfw_processor.json. The processor never crops:
        # the env does (envs.wrappers.CropImage, applied by rlfw.build.make_env_fn), so every consumer
        # (in-process engines, vLLM, an endpoint, a user's client) gets the same pixels.
        self.crop_px = crop_px  # pixels the env cuts from each side of its rendered image for this policy
        self.observation_px = tuple(observation_px) if observation_px else None  # (H, W) it was trained on
        self.image_token_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
        self.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_id
        self._text_ids: dict[str, tuple[int, ...]] = {}  # see _encode_text
        self._newline_ids = tokenizer.encode("\n", add_special_tokens=False)
        self._gen_prompt_ids = self._encode_text("<|im_start|>assistant\n")
        # tokens a reply must never contain: structure and vision placeholders
        self.banned_token_ids = sorted({
            tokenizer.convert_tokens_to_ids(t) for t in
            ["<|im_start|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
        } | ({tokenizer.pad_token_id} - {None, self.eos_token_id}))

    # -- persistence ---------------------------------------------------------------------------
    def save_pretrained(self, path: str | Path) -> None:
        self.tokenizer.save_pretrained(str(path))
        self.image_processor.save_pretrained(str(path))
        extra = {"crop_px": self.crop_px}
        if self.observation_px:
            extra["observation_px"] = list(self.observation_px)
        (Path(path) / RLFW_PROCESSOR_FILE).write_text(json.dumps(extra))

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "PolicyProcessor":
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        tokenizer.padding_side = "left"
        extra = Path(path) / RLFW_PROCESSOR_FILE
        info = json.loads(extra.read_text()) if extra.exists() else {}
        return cls(tokenizer, Qwen2VLImageProcessorPil.from_pretrained(str(path)), crop_px=info.get("crop_px", 0),
                   observation_px=info.get("observation_px"))

    # -- encoding ------------------------------------------------------------------------------
    def _encode_text(self, text: str) -> list[int]:
        # an env repeats a handful of texts (its task prompts, its feedback), so their ids are kept:
        # a bounded table, emptied when full, so that a stream of unique texts costs no memory
        if (ids := self._text_ids.get(text)) is None:
            if len(self._text_ids) >= _TEXT_CACHE_SIZE:
                self._text_ids.clear()
            ids = self._text_ids[text] = tuple(self.tokenizer.encode(text, add_special_tokens=False))
        return list(ids)

    def check_image(self, image: np.ndarray) -> np.ndarray:
        """`image` if it has the size this policy was trained on; else a ValueError naming the fix
        (an uncropped observation would otherwise be read silently as a different maze)."""
        if self.observation_px and tuple(image.shape[:2]) != self.observation_px:
            h, w = image.shape[:2]
            hint = (f" (an env observation not cropped by {self.crop_px} px a side: build envs with "
                    f"rlfw.build.make_env_fn(env, crop_px=processor.crop_px))"
                    if (h - 2 * self.crop_px, w - 2 * self.crop_px) == self.observation_px else "")
            raise ValueError(f"a {h}x{w} image; this policy reads {self.observation_px[0]}x{self.observation_px[1]} "
                             f"observations{hint}")
        return image

    def n_image_tokens(self, image: np.ndarray) -> int:
        """LM placeholder tokens for `image`, from its size alone (no pixel processing)."""
        h, w = self.check_image(image).shape[:2]
        merge = self.image_processor.merge_size
        return self.image_processor.get_number_of_image_patches(h, w) // (merge * merge)

    def image_features(self, image: np.ndarray) -> ImageFeatures:
        out = self.image_processor(images=[self.check_image(image)], return_tensors="pt")
        return ImageFeatures(out["pixel_values"], out["image_grid_thw"][0])

    def encode_message(self, message: dict, images: list[np.ndarray] | None = None) -> list[int]:
        """Ids of one chat message; its image placeholders expand to each image's token count."""
        text = self.tokenizer.apply_chat_template([message], tokenize=False, add_generation_prompt=False)
        ids = self._encode_text(text)
        if not images:
            return ids
        out, it = [], iter(images)
        for tok in ids:
            if tok == self.image_token_id:
                out.extend([tok] * self.n_image_tokens(next(it)))
            else:
                out.append(tok)
        return out

    @property
    def generation_prompt_ids(self) -> list[int]:
        """`<|im_start|>assistant\\n`: appended before the model's turn."""
        return list(self._gen_prompt_ids)

    @property
    def turn_end_ids(self) -> list[int]:
        """What follows `<|im_end|>` between messages."""
        return list(self._newline_ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def collate(
    sequences: list[list[int]],
    images: list[list[ImageFeatures]],
    image_token_id: int,
    pad_token_id: int,
    left_pad: bool,
) -> dict[str, torch.Tensor]:
    """Pad a batch of id lists and stack their images into the model's keyword arguments."""
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        cols = slice(width - len(seq), width) if left_pad else slice(0, len(seq))
        input_ids[i, cols] = torch.tensor(seq, dtype=torch.long)
        attention_mask[i, cols] = 1
    batch = {"input_ids": input_ids, "attention_mask": attention_mask}
    flat = [f for per_seq in images for f in per_seq]
    if flat:
        batch["pixel_values"] = torch.cat([f.pixel_values for f in flat])
        batch["image_grid_thw"] = torch.stack([f.grid_thw for f in flat])
        batch["mm_token_type_ids"] = ((input_ids == image_token_id) & attention_mask.bool()).long()
    return batch
