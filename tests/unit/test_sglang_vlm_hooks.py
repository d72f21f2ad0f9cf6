"""rollout/sglang_vlm.py's stand-in text: its tokens line up one to one with the ids sent with images."""

from __future__ import annotations

from rollout.sglang_vlm import stand_in_text

SPECIAL = {"start": 10, "end": 11, "image": 12, "video": 13}
NAMES = {10: "<|vision_start|>", 11: "<|vision_end|>", 12: "<|image_pad|>", 13: "<|video_pad|>"}


def test_image_blocks_collapse_and_every_other_token_is_one_filler() -> None:
    ids = [1, 2, 10, 12, 12, 12, 11, 3, 10, 12, 11, 4]
    text = stand_in_text(ids, SPECIAL, NAMES, "<f>")
    block = "<|vision_start|><|image_pad|><|vision_end|>"
    assert text == "<f><f>" + block + "<f>" + block + "<f>"


def test_stray_vision_tokens_are_text() -> None:
    # A sampled pad or an unclosed block is no image: it stands in as one token, like any other.
    ids = [12, 10, 12, 12, 5]
    assert stand_in_text(ids, SPECIAL, NAMES, "<f>") == "<f>" * 5
