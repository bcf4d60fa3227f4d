"""A tiny Qwen3-VL policy built locally: model config, tokenizer, image processor, chat template.

Nothing here touches a model hub. `build_tiny_vl` returns a randomly initialised
`Qwen3VLForConditionalGeneration` of a few million parameters together with a `PolicyProcessor`
whose tokenizer is a byte-level BPE trained on the environment's own text, with merges allowed
across spaces (only newlines split), so the environment's fixed prompt lines become single tokens
and a turn's prompt is mostly image tokens. The text itself is unchanged: a real Qwen3-VL
checkpoint reads the same prompt with its own tokenizer. Every action string of the environment
(e.g. VisGym's `('move', 0)`) is added as a single token, so one turn of a maze costs about two
decode steps (the action and `<|im_end|>`). The result is saved with
`save_pretrained`, so the very same loading code (`rlfw.models.load_policy`) serves it and a real
Qwen3-VL checkpoint.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from rlfw.config import TinyVLSpec
from rlfw.models.processing import PolicyProcessor

# Special tokens of the Qwen chat format, in the order Qwen uses them.
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# A minimal Qwen-style chat template: system/user/assistant turns, images as vision placeholders.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|im_start|>{{ message['role'] }}\n"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "<|im_end|>\n"
    "{%- endfor -%}"
    # an expression, so the newline survives the whitespace control: the same ids as
    # PolicyProcessor.generation_prompt_ids, for any consumer of the HF template (TRL, vLLM chat)
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def build_tokenizer(corpus: list[str], action_tokens: list[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train a line-level byte BPE on `corpus`; add Qwen's special tokens and each action as one token."""
    tok = Tokenizer(models.BPE())
    # Split only at newlines, so merges may grow into whole lines: a fixed task prompt of a few
    # hundred characters becomes about a dozen tokens, while any byte string stays encodable.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("\n", behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        extra_special_tokens={
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "vision_start_token": "<|vision_start|>",
            "vision_end_token": "<|vision_end|>",
        },
    )
    fast.add_tokens(list(action_tokens))
    fast.padding_side = "left"
    return fast


def build_processor(tokenizer: PreTrainedTokenizerFast, spec: TinyVLSpec, image_px: int) -> PolicyProcessor:
    """A processor whose image processor keeps `image_px`-sized images (after the crop) unresized."""
    image_px -= 2 * spec.image_crop_px
    factor = spec.patch_size * spec.spatial_merge_size
    if image_px % factor:
        raise ValueError(
            f"image side {image_px}px is not a multiple of patch_size*spatial_merge_size={factor}; "
            f"set env.cell_px so the grid aligns with the vision patches"
        )
    pixels = image_px * image_px
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=spec.patch_size,
        merge_size=spec.spatial_merge_size,
        temporal_patch_size=2,
        size={"shortest_edge": min(pixels, factor * factor), "longest_edge": max(pixels, 4 * pixels)},
    )
    return PolicyProcessor(tokenizer, image_processor, crop_px=spec.image_crop_px, observation_px=(image_px, image_px))


def build_model_config(spec: TinyVLSpec, tokenizer: PreTrainedTokenizerFast, image_px: int) -> Qwen3VLConfig:
    head_dim = spec.hidden_size // spec.num_heads
    half = head_dim // 2
    mrope = [half - 2 * (half // 3), half // 3, half // 3]  # temporal, height, width; sums to head_dim/2
    grid = (image_px - 2 * spec.image_crop_px) // spec.patch_size
    return Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=spec.hidden_size,
            intermediate_size=spec.intermediate_size,
            num_hidden_layers=spec.num_layers,
            num_attention_heads=spec.num_heads,
            num_key_value_heads=spec.num_kv_heads,
            head_dim=head_dim,
            max_position_embeddings=8192,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope,
                             "mrope_interleaved": True},
            pad_token_id=tokenizer.pad_token_id,
        ),
        vision_config=dict(
            depth=spec.vision_depth,
            hidden_size=spec.vision_hidden_size,
            intermediate_size=4 * spec.vision_hidden_size,
            num_heads=spec.vision_heads,
            patch_size=spec.patch_size,
            spatial_merge_size=spec.spatial_merge_size,
            temporal_patch_size=2,
            out_hidden_size=spec.hidden_size,
            num_position_embeddings=max(grid, 2) ** 2,
            deepstack_visual_indexes=[],
        ),
        image_token_id=tokenizer.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tokenizer.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"),
        vision_end_token_id=tokenizer.convert_tokens_to_ids("<|vision_end|>"),
        tie_word_embeddings=True,
    )


def build_tiny_vl(
    spec: TinyVLSpec, corpus: list[str], action_tokens: list[str], image_px: int, seed: int = 0
) -> tuple[Qwen3VLForConditionalGeneration, PolicyProcessor]:
    """Build the tiny policy and its processor from scratch (random init, seeded)."""
    import torch

    tokenizer = build_tokenizer(corpus, action_tokens, spec.vocab_size)
    processor = build_processor(tokenizer, spec, image_px)
    config = build_model_config(spec, tokenizer, image_px)
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, processor
