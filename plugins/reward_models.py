"""Rewards from a model served in the run: a model group of --sglang-config asked per sample, as slime's custom
rewards reach one (`get_model_url(args, name)`); docs/plugins.md "Reward models served in the run".

--custom-rm-path plugins.reward_models.generative_judge    a causal LM judge: P(yes) / (P(yes) + P(no)) after a verdict
                                                           prompt, from the judge's log-probs of the two verdicts
--custom-rm-path plugins.reward_models.classifier_reward   a sequence-classification reward model (SGLang --is-embedding,
                                                           its /v1/embeddings): the score of the conversation

Both take one sample, or a group with --group-rm. Their settings are keys of --custom-config-path (slime's way of
giving custom functions settings): `judge_model` (default "judge") and `reward_model` (default "reward") name the
group; `judge_prompt`, `judge_yes`, `judge_no` shape the verdict.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from rollout.context import current_context
from rollout.sglang_client import GenerateRefused, embeddings_async, generate_async
from slime_like.core.errors import EngineError
from slime_like.core.sample import Sample

JUDGE_PROMPT = (
    "Question:\n{prompt}\n\nReference answer: {label}\n\nCandidate answer:\n{response}\n\n"
    "Is the candidate answer correct? Answer Yes or No."
)
# SGLang 0.5.15 gives these heads a bias that Hugging Face's have not: a checkpoint without one is served with a
# randomly initialised bias (check_classifier refuses it).
BIASED_HEADS = ("Qwen2ForSequenceClassification", "Qwen3ForSequenceClassification")

_tokenizers: dict[str, Any] = {}
_paths: dict[tuple[str, str], str] = {}
_checked: set[str] = set()


class RewardModelError(RuntimeError):
    """The served reward model is missing, misconfigured, or gave no usable answer."""


def model_path(args: Any, name: str) -> str:
    """The checkpoint of model `name` of --sglang-config (its tokenizer tokenizes the reward requests)."""
    from rollout.model_groups import load_model_groups

    if not getattr(args, "sglang_config", None):
        raise RewardModelError(
            f"this reward asks the model group {name!r}, but the run has no --sglang-config: serve the reward model "
            "beside the policy as a model of --sglang-config (docs/multi-node.md, several models)"
        )
    key = (str(args.sglang_config), name)
    if key in _paths:
        return _paths[key]
    models = {m.name: m.model_path for m in load_model_groups(args)}
    if name not in models:
        raise RewardModelError(
            f"--sglang-config {args.sglang_config} has no model named {name!r} (it has {sorted(models)}): name the "
            "reward model's group so, or set judge_model / reward_model in --custom-config-path"
        )
    _paths[key] = models[name]
    return models[name]


def router_url(args: Any, name: str) -> str:
    """The router of model group `name` (args.sglang_model_routers, as slime's get_model_url reads it)."""
    routers = getattr(args, "sglang_model_routers", None) or {}
    if name not in routers:
        raise RewardModelError(f"model group {name!r} is not served in this run (served: {sorted(routers)})")
    host, port = routers[name]
    return f"http://{host}:{port}"


def tokenizer_of(path: str) -> Any:
    """The Hugging Face tokenizer of a checkpoint, loaded once."""
    if path not in _tokenizers:
        from transformers import AutoTokenizer

        _tokenizers[path] = AutoTokenizer.from_pretrained(path)
    return _tokenizers[path]


def _question(prompt: Any) -> str:
    """The prompt as text: a chat prompt's last user message."""
    if isinstance(prompt, list):
        users = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return str(users[-1]) if users else json.dumps(prompt)
    return str(prompt)


def _ids(encoded: Any) -> list[int]:
    """Token ids from apply_chat_template (a list, or a BatchEncoding in transformers 5)."""
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def chat_ids(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> list[int]:
    """The messages in the model's chat template, else their contents joined, as token ids."""
    if getattr(tokenizer, "chat_template", None):
        return _ids(tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True))
    return list(tokenizer.encode("\n".join(m["content"] for m in messages)))


def verdict_ids(tokenizer: Any, word: str) -> list[int]:
    """The tokens of one verdict word, as the judge would write them."""
    ids = list(tokenizer.encode(word, add_special_tokens=False))
    if not ids:
        raise RewardModelError(f"the verdict {word!r} has no tokens in the judge's tokenizer: set judge_yes/judge_no")
    return ids


def judge_prompt_ids(args: Any, tokenizer: Any, sample: Sample) -> list[int]:
    """The judge's prompt for one sample: the verdict question as a user turn, then the assistant's turn opens."""
    template = getattr(args, "judge_prompt", None) or JUDGE_PROMPT
    label = "" if sample.label is None else sample.label
    text = template.format(prompt=_question(sample.prompt), response=sample.response, label=label)
    return chat_ids(tokenizer, [{"role": "user", "content": text}], generation_prompt=True)


async def _ask(args: Any, call: Callable[[aiohttp.ClientSession], Awaitable[Any]]) -> Any:
    """One request to a group's router (rollout/sglang_client.py: with the run's secret) on the rollout's session; a
    broken connection or a 5xx answer is retried (--rm-retries, backing off: fault tolerance may be restarting an
    engine), a 4xx answer is final."""
    ctx = current_context()
    own = ctx is None or ctx.loop is not asyncio.get_running_loop()
    session = aiohttp.ClientSession(trust_env=False) if own else ctx.session
    retries, delay = int(getattr(args, "rm_retries", 3)), 0.5
    try:
        for attempt in range(retries + 1):
            try:
                return await call(session)
            except GenerateRefused as exc:
                raise RewardModelError(str(exc)) from exc
            except EngineError as exc:
                if attempt == retries:
                    raise RewardModelError(f"{exc} (after {retries + 1} tries)") from exc
            await asyncio.sleep(delay)
            delay *= 2
    finally:
        if own:
            await session.close()
    raise AssertionError("unreachable")


async def _logprob_sum(args: Any, url: str, prompt: list[int], continuation: list[int]) -> float:
    """The served model's log-probability of `continuation` after `prompt` (its prompt log-probs, nothing decoded)."""
    payload = {
        "input_ids": prompt + continuation,
        "sampling_params": {"max_new_tokens": 0, "temperature": 0},
        "return_logprob": True,
        "logprob_start_len": len(prompt) - 1,
    }
    answer = await _ask(args, lambda session: generate_async(session, url, payload))
    try:
        scored = answer["meta_info"]["input_token_logprobs"][-len(continuation) :]
        return sum(float(lp) for lp, _, _ in scored)
    except (KeyError, TypeError, ValueError) as exc:
        raise RewardModelError(f"{url}/generate gave no prompt log-probs ({exc!r}): {str(answer)[:300]}") from exc


async def _judge_one(args: Any, sample: Sample) -> float:
    name = getattr(args, "judge_model", None) or "judge"
    tokenizer = tokenizer_of(model_path(args, name))
    url = router_url(args, name)
    prompt = judge_prompt_ids(args, tokenizer, sample)
    yes = verdict_ids(tokenizer, str(getattr(args, "judge_yes", None) or "Yes"))
    no = verdict_ids(tokenizer, str(getattr(args, "judge_no", None) or "No"))
    yes_lp, no_lp = await asyncio.gather(_logprob_sum(args, url, prompt, yes), _logprob_sum(args, url, prompt, no))
    sample.metadata["judge_logprobs"] = {"yes": yes_lp, "no": no_lp}
    return verdict_probability(yes_lp, no_lp)


def verdict_probability(yes_logprob: float, no_logprob: float) -> float:
    """P(yes) / (P(yes) + P(no)) from the two log-probs: a sigmoid of their difference, without overflow."""
    diff = yes_logprob - no_logprob
    if diff >= 0:
        return 1.0 / (1.0 + math.exp(-diff))
    return math.exp(diff) / (1.0 + math.exp(diff))


async def generative_judge(args: Any, sample: Sample | list[Sample]) -> float | list[float]:
    """The judge group's probability that the response is correct: its P(yes) against P(no) after a verdict prompt."""
    if isinstance(sample, list):
        return list(await asyncio.gather(*(_judge_one(args, s) for s in sample)))
    return await _judge_one(args, sample)


def check_classifier(path: str) -> None:
    """Refuse a checkpoint SGLang would serve with a random score bias (SGLang 0.5.15's Qwen2/Qwen3 heads)."""
    if path in _checked:
        return
    config = json.loads((Path(path) / "config.json").read_text())
    arch = next((a for a in config.get("architectures") or [] if a in BIASED_HEADS), None)
    if arch is None:
        _checked.add(path)
        return
    from safetensors import safe_open

    names: set[str] = set()
    for shard in Path(path).glob("*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            names |= set(f.keys())
    if "score.bias" not in names:
        raise RewardModelError(
            f"{path} is a {arch} without a score bias, but SGLang's {arch} has one and leaves it randomly "
            "initialised when the checkpoint has none, so its scores would be off by a random constant: add a "
            "zero `score.bias` (shape [num_labels]) to the checkpoint's safetensors (docs/plugins.md)"
        )
    _checked.add(path)


def classifier_ids(args: Any, sample: Sample) -> list[int]:
    """The reward model's input for one sample: the prompt as the user turn, the response as the assistant's."""
    name = getattr(args, "reward_model", None) or "reward"
    path = model_path(args, name)
    check_classifier(path)
    messages = [
        {"role": "user", "content": _question(sample.prompt)},
        {"role": "assistant", "content": sample.response},
    ]
    return chat_ids(tokenizer_of(path), messages, generation_prompt=False)


async def _classify(args: Any, samples: list[Sample]) -> list[float]:
    # The router (sglang-router 0.3.2) passes on SGLang's OpenAI /v1/embeddings but not its native /classify; for a
    # reward model the "embedding" is the score head's output. (/v1/classify softmaxes it: 1.0 for a one-score RM.)
    name = getattr(args, "reward_model", None) or "reward"
    inputs = [classifier_ids(args, s) for s in samples]
    url = router_url(args, name)
    try:
        rows = await _ask(args, lambda session: embeddings_async(session, url, inputs, name))
        scores = [float(row[0]) for row in rows]
    except (RewardModelError, IndexError, TypeError, ValueError) as exc:
        raise RewardModelError(
            f"model group {name!r} gave no scores: {exc}; serve it as a reward model with "
            "`overrides: {is_embedding: true}` in --sglang-config"
        ) from exc
    if len(scores) != len(samples):
        raise RewardModelError(f"model group {name!r} gave {len(scores)} scores for {len(samples)} samples")
    return scores


async def classifier_reward(args: Any, sample: Sample | list[Sample]) -> float | list[float]:
    """The reward model group's score of the conversation (prompt as the user turn, response as the assistant's)."""
    if isinstance(sample, list):
        return await _classify(args, sample)
    return (await _classify(args, [sample]))[0]
