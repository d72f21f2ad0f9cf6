"""SFT samples from data rows instead of sampling: `--custom-generate-function-path plugins.sft_generate.generate`.

With `--loss-type sft_loss` (slime_like/trainer/algorithms/sft.py) the same launch script, data loading, engine,
checkpoints and evaluation serve a warm start and then RL. For multi-turn chat data only the assistant's
tokens are trained on: the mask is 1 on each assistant message (its content and end-of-turn token) and 0
on system, user and tool messages and on the chat template's generation prompt (e.g.
"<|im_start|>assistant\\n"). A row's prompt is either chat messages including the assistant's turns
(--input-key messages), or a prompt string whose response is the row's label (e.g. --label-key response).
"""

from __future__ import annotations

from typing import Any

from rollout.generate import generate as sample_from_model
from slime_like.core.sample import Sample, Status


def _render(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
    if not messages:
        return ""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def _extend(tokenizer: Any, text: str, done: str, tokens: list[int], mask: list[int], value: int) -> str:
    """Tokenise `text` past the already-tokenised prefix `done`, appending with mask `value`."""
    if not text.startswith(done):
        raise ValueError("the chat template does not render conversations prefix by prefix; cannot mask turns")
    ids = tokenizer(text[len(done) :], add_special_tokens=False)["input_ids"]
    tokens.extend(ids)
    mask.extend([value] * len(ids))
    return text


def chat_tokens_and_mask(tokenizer: Any, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """Token ids of a conversation and a 0/1 mask that is 1 exactly on the assistant's turns."""
    tokens: list[int] = []
    mask: list[int] = []
    done = ""
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            done = _extend(tokenizer, _render(tokenizer, messages[:i], True), done, tokens, mask, 0)
            done = _extend(tokenizer, _render(tokenizer, messages[: i + 1], False), done, tokens, mask, 1)
        else:
            done = _extend(tokenizer, _render(tokenizer, messages[: i + 1], False), done, tokens, mask, 0)
    return tokens, mask


async def generate(ctx: Any, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Build the sample from its data row (no sampling): tokens, response and the assistant loss mask.

    Evaluation samples (marked by the rollout's evaluation with metadata["eval_dataset"]) are generated
    by the default generate function, so --eval-interval measures the model while it is fine-tuned.
    """
    if "eval_dataset" in sample.metadata:
        return await sample_from_model(ctx, sample, sampling_params)
    tok = ctx.tokenizer
    if isinstance(sample.prompt, list):
        tokens, mask = chat_tokens_and_mask(tok, sample.prompt)
        if 1 not in mask:
            raise ValueError(f"sample {sample.index}: the conversation has no assistant message to train on")
        prompt_len = mask.index(1)
    else:
        if sample.label is None:
            raise ValueError(f"sample {sample.index}: an SFT row with a string prompt needs its response as the label")
        prompt_ids = tok(sample.prompt, add_special_tokens=False)["input_ids"]
        response_ids = tok(str(sample.label), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        tokens, mask = prompt_ids + response_ids, [0] * len(prompt_ids) + [1] * len(response_ids)
        prompt_len = len(prompt_ids)
    sample.tokens = tokens
    sample.response_length = len(tokens) - prompt_len
    sample.loss_mask = mask[prompt_len:]
    sample.response = tok.decode(tokens[prompt_len:])
    sample.status = Status.COMPLETED
    return sample
