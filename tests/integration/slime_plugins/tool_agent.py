"""A calculator agent built on slime's default `generate`; it scores the samples whose tool call failed itself,
the reward function scores the rest with a dict that has non-numeric entries (--reward-key score).

    --custom-generate-function-path slime_plugins.tool_agent.generate
    --custom-rm-path slime_plugins.tool_agent.reward_func --reward-key score
"""

import re

from slime.rollout.sglang_rollout import GenerateState
from slime.rollout.sglang_rollout import generate as default_generate
from slime.utils.types import Sample

CALLS = [r"<calc>6\*7</calc>", r"<calc>6/0</calc>"]  # sample index % 2 picks one
ANSWER = r"<answer>[0-9]{1,2}</answer>"
SCORED = []  # indices the reward function saw


def calculator(expression: str) -> str:
    """a*b or a/b of two integers."""
    a, op, b = re.fullmatch(r"(\d+)([*/])(\d+)", expression).groups()
    return str(int(a) * int(b)) if op == "*" else str(int(a) // int(b))


async def generate(args, sample: Sample, sampling_params) -> Sample:
    """Turn 1 calls the calculator; a failed call ends the sample with reward 0, else turn 2 answers."""
    state = GenerateState(args)
    await default_generate(args, sample, {**sampling_params, "regex": CALLS[sample.index % 2]})
    expression = re.search(r"<calc>(.*?)</calc>", sample.response).group(1)
    try:
        observation = f"\n<result>{calculator(expression)}</result>\n"
    except ZeroDivisionError as exc:
        sample.reward = {"score": 0.0, "pred": None, "error": f"tool failed: {exc}"}
        return sample
    tokens = state.tokenizer(observation, add_special_tokens=False)["input_ids"]
    sample.append_response_tokens(args, tokens=tokens, trainable=False, text=observation)
    sample.status = Sample.Status.PENDING  # slime's generate continues a pending sample
    await default_generate(args, sample, {**sampling_params, "regex": ANSWER})
    return sample


async def reward_func(args, sample, **kwargs):
    """{"score": 1/0, "pred": the answer, "tool_calls": 1, "trace": [...]}."""
    SCORED.append(sample.index)
    pred = re.search(r"<answer>(.*?)</answer>", sample.response)
    pred = pred.group(1) if pred else None
    return {"score": float(pred == str(sample.label)), "pred": pred, "tool_calls": 1, "trace": ["calc", "answer"]}
