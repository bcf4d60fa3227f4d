"""PolicyProcessor keeps the ids of the texts it has encoded: repeats cost no tokenizer call and give
the tokenizer's own ids, callers get their own lists, and the table stays bounded."""

from pathlib import Path

import numpy as np

from rlfw.models import processing
from rlfw.models.processing import PolicyProcessor

CHECKPOINT = Path(__file__).resolve().parents[2] / "checkpoints" / "tiny_vl_maze_sft"


def uncached(processor: PolicyProcessor, message: dict, n_image_tokens: int) -> list[int]:
    text = processor.tokenizer.apply_chat_template([message], tokenize=False, add_generation_prompt=False)
    ids = processor.tokenizer.encode(text, add_special_tokens=False)
    return [t for tok in ids for t in ([tok] * n_image_tokens if tok == processor.image_token_id else [tok])]


def test_repeated_texts_give_the_tokenizers_ids_without_encoding_again(monkeypatch):
    processor = PolicyProcessor.from_pretrained(CHECKPOINT)
    image = np.zeros((*processor.observation_px, 3), np.uint8)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": t}]}
                for t in ["Reach the red square.", "Reach the red square.\nMoved right.", "Stop."]]
    want = [uncached(processor, m, processor.n_image_tokens(image)) for m in messages]
    assert [processor.encode_message(m, [image]) for m in messages] == want
    calls = []
    encode = processor.tokenizer.encode
    monkeypatch.setattr(processor.tokenizer, "encode", lambda *a, **k: calls.append(a) or encode(*a, **k))
    for _ in range(3):
        got = [processor.encode_message(m, [image]) for m in messages]
        assert got == want and calls == []
        got[0].append(-1)  # a caller's list is its own
    assert processor.generation_prompt_ids == processor.tokenizer.encode("<|im_start|>assistant\n",
                                                                         add_special_tokens=False)


def test_the_table_of_encoded_texts_is_bounded(monkeypatch):
    monkeypatch.setattr(processing, "_TEXT_CACHE_SIZE", 8)
    processor = PolicyProcessor.from_pretrained(CHECKPOINT)
    for i in range(30):
        text = f"square {i}"
        assert processor._encode_text(text) == processor.tokenizer.encode(text, add_special_tokens=False)
        assert len(processor._text_ids) <= 8
