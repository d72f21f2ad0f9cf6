"""slime's SFT masks (slime.utils.mask_utils, --loss-mask-type) on a ChatML tokenizer: what each type trains on."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from slime_like.core import slime_finder

slime_finder.install()
from slime.utils.mask_utils import MultiTurnLossMaskGenerator, get_response_lengths  # noqa: E402

# Qwen2.5's shape of template: a default system prompt when the conversation has none.
WITH_DEFAULT_SYSTEM = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHAT = [
    {"role": "user", "content": "2+2="},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "again"},
    {"role": "assistant", "content": "four"},
]


@pytest.fixture(scope="module")
def chatml(tiny_qwen3: Path):
    """The tiny model's ChatML tokenizer (no default system prompt)."""
    return AutoTokenizer.from_pretrained(tiny_qwen3)


@pytest.fixture(scope="module")
def qwen25_like(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory):
    """The same tokenizer with a template that adds a default system prompt, as Qwen2.5's does."""
    out = tmp_path_factory.mktemp("qwen25-like")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_qwen3 / name, out / name)
    (out / "chat_template.jinja").write_text(WITH_DEFAULT_SYSTEM)
    return AutoTokenizer.from_pretrained(out)


def rendered(tokenizer, messages: list[dict], **kwargs) -> list[int]:
    """The whole conversation through the template at once: the ids every type must reproduce."""
    return list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs))


def trained_text(tokenizer, ids: list[int], mask: list[int]) -> list[str]:
    return MultiTurnLossMaskGenerator(tokenizer).get_text_from_loss_mask(ids, mask)


def test_response_lengths_run_from_the_first_trained_token() -> None:
    assert get_response_lengths([[0, 0, 1, 0, 1], [0, 0], [1]]) == [3, 0, 1]


@pytest.mark.parametrize("kind", ["qwen", "qwen3"])
def test_qwen_types_train_the_assistant_turns_of_the_whole_conversation(kind: str, chatml, qwen25_like) -> None:
    for tokenizer in (chatml, qwen25_like):
        ids, mask = MultiTurnLossMaskGenerator(tokenizer, kind).get_loss_mask(CHAT)
        if kind == "qwen" or tokenizer is chatml:  # qwen3's probe turn assumes no default system prompt
            assert ids == rendered(tokenizer, CHAT)  # the conversation rendered at once
            assert trained_text(tokenizer, ids, mask) == ["4<|im_end|>\n", "four<|im_end|>\n"]
    generator = MultiTurnLossMaskGenerator(qwen25_like, "qwen")
    header = len(qwen25_like("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"])
    system = len(qwen25_like("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")["input_ids"])
    assert (generator.system_message_length, generator.gen_token_length) == (system, header)


def test_step_loss_mask_and_consecutive_tool_turns(chatml) -> None:
    chat = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "call", "step_loss_mask": 0},
        {"role": "tool", "content": "sun"},
        {"role": "tool", "content": "warm"},
        {"role": "assistant", "content": "sunny"},
    ]
    for kind in ("qwen", "qwen3", "qwen3_5"):
        ids, mask = MultiTurnLossMaskGenerator(chatml, kind).get_loss_mask(chat)
        assert ids == rendered(chatml, chat)
        assert trained_text(chatml, ids, mask) == ["sunny<|im_end|>\n"], kind


def test_qwen3_5_leaves_the_opening_think_tag_untrained(chatml) -> None:
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>\nhmm</think>ok"}]
    ids, mask = MultiTurnLossMaskGenerator(chatml, "qwen3_5").get_loss_mask(chat)
    assert "".join(trained_text(chatml, ids, mask)) == "hmm</think>ok<|im_end|>\n"


def test_distill_qwen_trains_the_last_messages_content(chatml) -> None:
    ids, mask = MultiTurnLossMaskGenerator(chatml, "distill_qwen").get_loss_mask(CHAT[:2])
    prompt = rendered(chatml, CHAT[:1], add_generation_prompt=True)
    assert ids[: len(prompt)] == prompt and chatml.decode(ids[len(prompt) :]) == "4"
    assert mask == [0] * len(prompt) + [1] * (len(ids) - len(prompt))


def test_unknown_type_names_the_flag(chatml) -> None:
    with pytest.raises(ValueError, match="--loss-mask-type 'llama'"):
        MultiTurnLossMaskGenerator(chatml, "llama")
