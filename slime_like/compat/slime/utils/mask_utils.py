"""slime.utils.mask_utils: token ids and a loss mask over the assistant's turns of a chat, by --loss-mask-type.

The types and what each trains on, as slime defines them (each checked on a ChatML template in
tests/unit/test_sft_rollout_compat.py):
- `qwen`: each message rendered alone (tools with the first), the template's default system prompt cut from
  every later one; an assistant message trains on all but its generation header (its content and
  `<|im_end|>\\n`). A tokenizer with DeepSeek-distill's `<｜Assistant｜>` token goes to `distill_qwen`.
- `qwen3`: each message (consecutive tool messages together, as Qwen's template wraps them in one turn) rendered
  beside a fixed probe turn, so templates that render a turn by its position render it as in a conversation.
- `qwen3_5`: the whole conversation rendered once; tokens overlapping an assistant turn's characters (after its
  header and any opening `<think>\\n`, through `<|im_end|>\\n`) train.
- `distill_qwen`: the first message as the prompt (with the generation prompt), the last message's content as
  the response, which trains.
A message with `step_loss_mask` other than 1 trains on nothing.
"""

from __future__ import annotations

from typing import Any

LOSS_MASK_TYPES = ("qwen", "qwen3", "qwen3_5", "distill_qwen")
_PROBE = "FOR TESTING ONLY"  # content of the probe turns used to measure the template
_MASK_PROBE = {"role": "user", "content": "FOR CALCULATING LOSS MASK ONLY"}
_DISTILL_TOKEN = "<｜Assistant｜>"


def get_response_lengths(loss_masks: list[list[int]]) -> list[int]:
    """Per mask: the tokens from its first 1 to its end (0 when nothing trains)."""
    return [len(mask) - mask.index(1) if 1 in mask else 0 for mask in loss_masks]


def _ids(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs))


class MultiTurnLossMaskGenerator:
    """slime's generator: `get_loss_mask(messages, tools=None) -> (token_ids, loss_mask)` for its tokenizer type."""

    def __init__(self, tokenizer: Any, tokenizer_type: str = "qwen") -> None:
        if tokenizer_type not in LOSS_MASK_TYPES:
            raise ValueError(f"--loss-mask-type {tokenizer_type!r}: expected one of {', '.join(LOSS_MASK_TYPES)}")
        self.tokenizer = tokenizer
        self.tokenizer_type = tokenizer_type
        self.system_message_length = self.gen_token_length = self._probe_length = 0
        if tokenizer_type in ("qwen", "qwen3"):
            self.system_message_length, self.gen_token_length = self.get_system_message_length()
        if tokenizer_type == "qwen3":
            self._probe_length = len(_ids(tokenizer, [_MASK_PROBE]))  # the probe turn beside each message

    def get_system_message_length(self) -> tuple[int, int]:
        """(tokens of the default system prompt the template puts before a lone message, tokens of its
        generation header)."""
        user = {"role": "user", "content": _PROBE}
        one, two = _ids(self.tokenizer, [user]), _ids(self.tokenizer, [user, user])
        turn = len(two) - len(one)  # the second user turn alone: the default system prompt comes once
        header = len(_ids(self.tokenizer, [user], add_generation_prompt=True)) - len(one)
        return len(one) - turn, header

    def get_response_lengths(self, loss_masks: list[list[int]]) -> list[int]:
        """See `get_response_lengths`."""
        return get_response_lengths(loss_masks)

    def _turn_mask(self, message: dict[str, Any], n: int) -> list[int]:
        if message["role"] != "assistant" or message.get("step_loss_mask", 1) != 1:
            return [0] * n
        return [0] * self.gen_token_length + [1] * (n - self.gen_token_length)

    def _per_turn(self, messages: list[dict[str, Any]], tools: Any, render) -> tuple[list[int], list[int]]:
        ids: list[int] = []
        mask: list[int] = []
        i = 0
        while i < len(messages):
            end = i + 1
            if self.tokenizer_type == "qwen3" and messages[i]["role"] == "tool":
                while end < len(messages) and messages[end]["role"] == "tool":
                    end += 1
            turn = render(messages[i:end], i == 0, tools)
            if i > 0 and messages[i]["role"] != "system":
                turn = turn[self.system_message_length :]
            ids += turn
            mask += self._turn_mask(messages[i], len(turn))
            i = end
        return ids, mask

    def _render_alone(self, group: list[dict[str, Any]], first: bool, tools: Any) -> list[int]:
        return _ids(self.tokenizer, group, **({"tools": tools} if first else {}))

    def _render_beside_probe(self, group: list[dict[str, Any]], first: bool, tools: Any) -> list[int]:
        probe = self._probe_length
        if first:  # the probe after the turn, cut off again
            return _ids(self.tokenizer, [*group, _MASK_PROBE], tools=tools)[:-probe]
        return _ids(self.tokenizer, [_MASK_PROBE, *group])[probe:]

    def _qwen3_5(self, messages: list[dict[str, Any]], tools: Any) -> tuple[list[int], list[int]]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, tools=tools)
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = encoded["input_ids"], encoded.get("offset_mapping")
        if offsets is None:
            raise ValueError("--loss-mask-type qwen3_5 needs a fast tokenizer (one with return_offsets_mapping)")
        if ids != _ids(self.tokenizer, messages, tools=tools):
            raise ValueError("--loss-mask-type qwen3_5: the rendered text tokenises differently from the template")
        trained = [False] * len(text)
        header, think, end_marker = "<|im_start|>assistant\n", "<think>\n", "<|im_end|>"
        cursor = 0
        for message in (m for m in messages if m["role"] == "assistant"):
            at = text.find(header, cursor)
            stop = text.find(end_marker, at + len(header)) if at >= 0 else -1
            if stop < 0:
                raise ValueError("--loss-mask-type qwen3_5: an assistant turn is not where the template should put it")
            start = at + len(header)
            stop += len(end_marker) + (text[stop + len(end_marker) : stop + len(end_marker) + 1] == "\n")
            cursor = stop
            if message.get("step_loss_mask", 1) == 1:
                start += len(think) if text.startswith(think, start) else 0
                trained[start:stop] = [True] * (stop - start)
        return ids, [int(end > start and any(trained[start:end])) for start, end in offsets]

    def _distill(self, messages: list[dict[str, Any]], tools: Any) -> tuple[list[int], list[int]]:
        prompt = self.tokenizer.apply_chat_template(
            messages[:1], tokenize=False, add_generation_prompt=True, tools=tools
        )
        prompt_ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        response_ids = self.tokenizer(messages[-1]["content"], add_special_tokens=False)["input_ids"]
        trains = int(messages[-1].get("step_loss_mask", 1) == 1)
        return prompt_ids + response_ids, [0] * len(prompt_ids) + [trains] * len(response_ids)

    def get_loss_mask(self, messages: list[dict[str, Any]], tools: Any = None) -> tuple[list[int], list[int]]:
        """(token ids, loss mask) of the conversation: 1 on what the assistant wrote."""
        kind = self.tokenizer_type
        if kind == "distill_qwen" or (kind == "qwen" and _DISTILL_TOKEN in self.tokenizer.get_added_vocab()):
            return self._distill(messages, tools)
        if kind == "qwen3_5":
            return self._qwen3_5(messages, tools)
        return self._per_turn(messages, tools, self._render_alone if kind == "qwen" else self._render_beside_probe)

    def get_text_from_loss_mask(self, token_ids: list[int], loss_masks: list[int]) -> list[str]:
        """The decoded runs of trained tokens."""
        runs: list[list[int]] = []
        for i, (token, trains) in enumerate(zip(token_ids, loss_masks, strict=False)):
            if trains:
                if i == 0 or not loss_masks[i - 1]:
                    runs.append([])
                runs[-1].append(token)
        return [self.tokenizer.decode(run) for run in runs]
