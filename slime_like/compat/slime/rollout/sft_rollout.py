"""slime.rollout.sft_rollout: `--rollout-function-path slime.rollout.sft_rollout.generate_rollout` for slime's SFT
scripts (with `--loss-type sft_loss`, `--debug-train-only`: no SGLang server is started).

Each prompt row holds chat messages (`--input-key messages`, no `--apply-chat-template`) and optionally tools
(`--tool-key`); the sample's tokens and loss mask come from `--loss-mask-type` (slime.utils.mask_utils).
"""

from __future__ import annotations

import logging
from typing import Any

from slime.utils.mask_utils import MultiTurnLossMaskGenerator
from slime.utils.processing_utils import load_tokenizer

__all__ = ["generate_rollout"]

logger = logging.getLogger(__name__)

_GENERATORS: dict[tuple[str, str], MultiTurnLossMaskGenerator] = {}  # (checkpoint, mask type) -> generator


def _generator(args: Any) -> MultiTurnLossMaskGenerator:
    key = (args.hf_checkpoint, args.loss_mask_type)
    if key not in _GENERATORS:
        tokenizer = load_tokenizer(args.hf_checkpoint, trust_remote_code=True)
        _GENERATORS[key] = MultiTurnLossMaskGenerator(tokenizer, tokenizer_type=args.loss_mask_type)
        logger.info("SFT rollout: loss masks by --loss-mask-type %s", args.loss_mask_type)
    return _GENERATORS[key]


def generate_rollout(args: Any, rollout_id: int, data_buffer: Any, evaluation: bool = False) -> list[list[Any]]:
    """`--rollout-batch-size` rows as SFT samples: tokens, the response from the first trained token, its mask."""
    if evaluation:
        raise ValueError("slime.rollout.sft_rollout.generate_rollout builds training samples; it does not evaluate")
    generator = _generator(args)
    groups = data_buffer.get_samples(args.rollout_batch_size)
    for group in groups:
        for sample in group:
            if not isinstance(sample.prompt, list):
                raise ValueError(
                    f"SFT rollout: sample {sample.index}'s prompt is {type(sample.prompt).__name__}, not chat "
                    "messages: point --input-key at the messages and leave out --apply-chat-template"
                )
            tokens, mask = generator.get_loss_mask(sample.prompt, tools=sample.metadata.get("tools"))
            response_length = generator.get_response_lengths([mask])[0]
            if response_length == 0:
                raise ValueError(f"SFT rollout: sample {sample.index} has no assistant turn to train on")
            sample.tokens = tokens
            sample.response_length = response_length
            sample.loss_mask = mask[-response_length:]
            sample.response = generator.tokenizer.decode(tokens[-response_length:])
            sample.reward = 0
    return groups
