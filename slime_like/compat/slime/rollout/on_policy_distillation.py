"""slime.rollout.on_policy_distillation: the teacher's log-probs of each sampled response, from an SGLang server.

slime's OPD scripts pass `--custom-rm-path slime.rollout.on_policy_distillation.reward_func`,
`--custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards` and the teacher's
`/generate` URL as `--rm-url`, with `--use-opd --opd-type sglang`. Same names and result here, one difference:
slime's reward function returns the teacher's whole answer as the sample's reward and the post-process cuts the
log-probs out of it; ours stores them on the sample at once (`sample.teacher_log_probs`, the response tokens'
only) and scores 0.0, so the reward stays a number for every check and metric on the way. The post-process then
gives every sample slime's training reward, 0.0: the learning signal is the teacher's KL term
(slime_like/trainer/algorithms/opd.py), unless a task reward is added by a post-process of the user's own.
"""

from __future__ import annotations

from typing import Any

from slime.utils.http_utils import post
from slime.utils.types import Sample

from buffer.train_data import trainable


async def reward_func(args: Any, sample: Sample, **kwargs: Any) -> float:
    """Ask the teacher at --rm-url for its log-probs of the sample's tokens; keep the response's on the sample."""
    payload = {
        "input_ids": sample.tokens,
        "sampling_params": {"temperature": args.rollout_temperature, "max_new_tokens": 0, "skip_special_tokens": False},
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    answer = await post(args.rm_url, payload)
    # SGLang's input_token_logprobs: one (logprob, token id, text) per input token, None for the first.
    scored = [item[0] for item in answer["meta_info"]["input_token_logprobs"][1:]]
    n = sample.response_length
    if len(scored) < n:
        raise ValueError(f"the teacher at --rm-url scored {len(scored)} tokens, fewer than the {n} of the response")
    sample.teacher_log_probs = [float(x) for x in scored[len(scored) - n :]]
    return 0.0


def post_process_rewards(args: Any, samples: list[Sample], **kwargs: Any) -> tuple[list[float], list[float]]:
    """slime's: pure distillation trains on 0.0 rewards; every sample must have its teacher log-probs by now."""
    # Failed samples (a teacher that did not answer fails the sample's reward) do not train: they need none.
    missing = [s.index for s in samples if s.teacher_log_probs is None and trainable(s)]
    if missing:
        raise ValueError(
            f"samples {missing[:5]} have no teacher_log_probs: pair this post-process with "
            "--custom-rm-path slime.rollout.on_policy_distillation.reward_func"
        )
    zeros = [0.0] * len(samples)
    return zeros, list(zeros)
