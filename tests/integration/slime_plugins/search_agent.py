"""A Search-R1-style agent: search, read the retrieved passage, answer; scored by its own reward function.

--custom-generate-function-path slime_plugins.search_agent.generate
--custom-rm-path slime_plugins.search_agent.reward_func
"""

import re

from slime.rollout.sglang_rollout import GenerateState
from slime.utils.http_utils import post
from slime.utils.types import Sample

SEARCH_URL = "http://127.0.0.1:8000/retrieve"  # a local retrieval server (the test points it at its fake one)
TURNS = [r"<search>[a-z]{3,6}</search>", r"<answer>[0-9]</answer>"]
QUERY = re.compile(r"<search>(.*?)</search>")
ANSWER = re.compile(r"<answer>(.*?)</answer>")


async def search(query: str) -> str:
    """The top passage the retrieval server returns for `query`."""
    result = await post(SEARCH_URL, {"queries": [query], "topk": 1, "return_scores": False})
    return result["result"][0][0]["document"]["contents"]


async def generate(args, sample: Sample, sampling_params) -> Sample:
    """Two turns through the router: a search query (its result appended, not trained on), then an answer."""
    assert not args.partial_rollout, "this agent restarts every sample"
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    sample.tokens = state.tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
    sample.response, sample.response_length, sample.loss_mask, sample.rollout_log_probs = "", 0, None, None
    for regex in TURNS:
        payload = {
            "input_ids": sample.tokens,
            "sampling_params": {**sampling_params, "regex": regex},
            "return_logprob": True,
        }
        output = await post(url, payload)
        meta = output["meta_info"]
        if meta["finish_reason"]["type"] == "abort":
            sample.status = Sample.Status.ABORTED
            return sample
        sample.append_response_tokens(
            args,
            tokens=[item[1] for item in meta["output_token_logprobs"]],
            log_probs=[item[0] for item in meta["output_token_logprobs"]],
            meta_info=meta,
            text=output["text"],
        )
        query = QUERY.search(output["text"])
        if sample.status != Sample.Status.COMPLETED or query is None:
            break
        observation = f"\n<information>{await search(query.group(1))}</information>\n"
        sample.append_response_tokens(
            args,
            tokens=state.tokenizer(observation, add_special_tokens=False)["input_ids"],
            trainable=False,
            text=observation,
        )
        sample.metadata.setdefault("queries", []).append(query.group(1))
    return sample


async def reward_func(args, sample, **kwargs):
    """1 for the right answer, 0.2 for a well-formed wrong one, 0 otherwise."""
    if not isinstance(sample, Sample):
        raise TypeError("Sample must be an instance of Sample class.")
    answer = ANSWER.search(sample.response)
    if answer is None:
        return 0.0
    return 1.0 if answer.group(1) == str(sample.label) else 0.2
