"""A solver with a variable number of reviewers, and a plain-def rollout function driving it.

    --rollout-function-path slime_plugins.multi_agent.generate_rollout
    --custom-generate-function-path slime_plugins.multi_agent.generate_with_agents

Each prompt sample becomes 1 + index % 3 samples that share its rollout_id and split its reward (1, or 2 when
someone answered right), so groups have different lengths. The rollout function takes one group more than it needs and hands it back.
"""

import asyncio
import copy

from slime.rollout.base_types import RolloutFnTrainOutput
from slime.rollout.sglang_rollout import GenerateState, generate, generate_and_rm_group
from slime.utils.async_utils import run
from slime.utils.types import Sample

ANSWER = r"<answer>[0-9]</answer>"


async def generate_with_agents(args, sample: Sample, sampling_params, evaluation=False) -> list[Sample]:
    """The solver's sample and index % 3 reviewers; a reward of 1 (2 if one is right) is split among them."""
    sample.rollout_id = sample.index
    agents = [sample] + [copy.deepcopy(sample) for _ in range(sample.index % 3)]
    for role, agent in enumerate(agents):
        agent.metadata["role"] = "solver" if role == 0 else "reviewer"
        await generate(args, agent, {**sampling_params, "regex": ANSWER})
    right = any(f"<answer>{sample.label}</answer>" in a.response for a in agents)
    for agent in agents:
        agent.reward = (2.0 if right else 1.0) / len(agents)
    return agents


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    """--rollout-batch-size groups through generate_and_rm_group; one extra group goes back to the data source."""
    assert not evaluation
    groups = data_source.get_samples(args.rollout_batch_size + 1)
    data_source.add_samples(groups[-1:])
    state = GenerateState(args)

    async def all_groups():
        return await asyncio.gather(*(generate_and_rm_group(args, g, state.sampling_params) for g in groups[:-1]))

    done = run(all_groups())
    agents = sum(len(x) if isinstance(x, list) else 1 for group in done for x in group)
    return RolloutFnTrainOutput(samples=done, metrics={"agents": agents})
