"""Weight updates under requests paused, not drained (--fully-async, --pause-generation-mode), on real servers.

For each mode several long greedy requests go through our generate path, generation pauses mid-way, the trainer's
next weights (one Megatron step away) are pushed as a new version and generation continues. No request is lost;
every sample ends with two version spans covering its response; the tokens of the old span are exactly the old
weights' (a greedy reference run before the pause) and the first token of the new span is not; the servers pass
the post-update check. What each mode does to the KV cache shows in the new span's log-probs against the trainer's
own log-probs of the whole sequence under the new weights: equal where the cache was recomputed (retract) or the
sample continued in a new request (abort), not equal where the old cache was kept (in_place).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
import requests
import torch

from rollout import sglang_client as client
from rollout.context import RolloutContext
from rollout.generate import generate
from rollout.pause import check_server_args, continue_all, pause_all
from rollout.sglang_server import SGLangServer
from slime_like.core.errors import EngineError
from slime_like.core.sample import Sample, Status
from slime_like.trainer.weights.check import check_servers, served_logprobs
from slime_like.trainer.weights.disk import DiskTransport
from slime_like.trainer.weights.distributed import DistributedTransport
from tests.integration.test_weight_update import SEQUENCE, train_one_step, trainable_engine

REQUESTS = 4
MAX_NEW = 300
PAUSE_AFTER = 40  # about this many tokens generated per request when generation pauses
SAME = 1e-4  # log-probs of the same weights and cache (fp32; measured ~1e-6)
VERSIONS = itertools.count(10, 10)  # each test starts at a fresh version and pushes the next one


@pytest.fixture(scope="module")
def engine(tiny_qwen3: Path):
    """The trainer on the servers' checkpoint; each test moves it one step further."""
    return trainable_engine(tiny_qwen3)


@pytest.fixture(scope="module")
def held_server(pause_server: SGLangServer) -> SGLangServer:
    """The session's server with the flags retract and in_place need (rollout/pause.py); the session's first server
    has none of them."""
    return pause_server


def load(url: str) -> tuple[int, int]:
    """Requests the server holds (running or queued) and the tokens they take in its KV cache."""
    loads = requests.get(f"{url}/get_load", timeout=10).json()
    return sum(entry["num_reqs"] for entry in loads), sum(entry["num_tokens"] for entry in loads)


async def generate_across_an_update(url: str, mode: str, update: Callable[[], None]) -> tuple[list[Sample], Sample]:
    """REQUESTS greedy samples through rollout.generate with the weights updated while they are paused in `mode`
    (as the --fully-async loop does it); also a reference sample generated before, on the old weights alone."""
    args = Namespace(fully_async=True, pause_generation_mode=mode, rollout_seed=1, rollout_max_context_len=None)
    params = {"max_new_tokens": MAX_NEW, "temperature": 0.0, "ignore_eos": True}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        ctx = RolloutContext(args, None, url, session, asyncio.Semaphore(2 * REQUESTS), server_urls=[url])
        reference = await generate(ctx, Sample(tokens=list(SEQUENCE), index=REQUESTS), params)
        samples = [Sample(tokens=list(SEQUENCE), index=i) for i in range(REQUESTS)]
        tasks = [asyncio.create_task(generate(ctx, s, params)) for s in samples]
        deadline = time.monotonic() + 60
        while (await asyncio.to_thread(load, url))[1] < REQUESTS * (len(SEQUENCE) + PAUSE_AFTER):
            assert time.monotonic() < deadline, "the requests did not start"
            await asyncio.sleep(0.02)
        ctx.aborting = mode == "abort"  # the loop asks for these aborts: answers are partial samples, not failures
        await asyncio.to_thread(pause_all, [url], mode)
        if mode == "abort":
            await asyncio.wait_for(asyncio.gather(*tasks), 30)  # every request answered with its tokens so far
            assert all(s.status == Status.ABORTED and 0 < s.response_length < MAX_NEW for s in samples), samples
            assert all(len(s.version_spans) == 1 for s in samples)
        assert (await asyncio.to_thread(load, url))[0] == (0 if mode == "abort" else REQUESTS)  # held in the engine
        await asyncio.to_thread(update)
        await asyncio.to_thread(continue_all, [url])  # the loop continues too (again: changes nothing)
        ctx.aborting = False
        if mode == "abort":  # the partial samples go on from their tokens, as a partial rollout
            tasks = [asyncio.create_task(generate(ctx, s, params)) for s in samples]
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
    return samples, reference


def check_spans(samples: list[Sample], reference: Sample, old: int, new: int, engine) -> list[float]:
    """Every sample finished with [[old, k], [new, MAX_NEW - k]], its old span exactly the old weights' tokens and
    the new span's first token not; returns, per sample, how far the new span's log-probs are from the trainer's
    log-probs of the whole sequence under the new weights."""
    ref_lps = torch.tensor(reference.rollout_log_probs)
    distances = []
    for sample in samples:
        assert sample.status == Status.TRUNCATED and sample.response_length == MAX_NEW, sample.metadata
        (v0, k), (v1, rest) = sample.version_spans
        assert (v0, v1) == (old, new) and 0 < k < MAX_NEW and k + rest == MAX_NEW, sample.version_spans
        assert sample.oldest_version() == old and sample.weight_version == new
        lps = torch.tensor(sample.rollout_log_probs)
        assert sample.tokens[: len(SEQUENCE) + k] == reference.tokens[: len(SEQUENCE) + k]
        assert (lps[:k] - ref_lps[:k]).abs().max() < SAME  # generated by the old weights, all of them
        assert (lps[k] - ref_lps[k]).abs() > 100 * SAME  # ... and the next one by the new ones
        trainer = engine.forward_logprobs([sample.tokens])[0][len(SEQUENCE) - 1 :]
        distances.append(float((lps[k:] - trainer[k:]).abs().max()))
    return distances


@pytest.mark.parametrize("mode", ["retract", "in_place"])
def test_requests_held_in_the_engine_span_the_update(mode, held_server, engine, tmp_path, tiny_qwen3) -> None:
    url = held_server.url
    check_server_args([url], mode)
    old = next(VERSIONS)
    client.set_weight_version(url, old)
    if mode == "in_place":  # the in-place broadcast path, into a server that holds paused requests
        transport = DistributedTransport([url], 1 << 20, timeout_s=60)
    else:
        transport = DiskTransport([url], 1 << 20, str(tiny_qwen3), str(tmp_path / "weights"), timeout_s=60)

    def update() -> None:
        train_one_step(engine)
        transport.update(engine.export_hf_weights(), old + 1, mode)

    try:
        samples, reference = asyncio.run(generate_across_an_update(url, mode, update))
    finally:
        transport.close()
    distances = check_spans(samples, reference, old, old + 1, engine)
    if mode == "retract":  # the cache was computed again with the new weights
        assert max(distances) < SAME, distances
    else:  # the new weights went on from the cache of the old ones
        assert min(distances) > 10 * SAME, distances
    assert check_servers(engine, [url], 1e-3, rank=0, when="after the update") < SAME


def test_aborted_requests_continue_on_the_new_weights(sglang_server, engine, tmp_path, tiny_qwen3) -> None:
    """abort needs no server flag: the session's server, restored to its weights and version at the end."""
    url = sglang_server.url
    original = client.weight_version(url)
    before = served_logprobs(url, SEQUENCE)
    old = next(VERSIONS)
    client.set_weight_version(url, old)
    transport = DiskTransport([url], 1 << 20, str(tiny_qwen3), str(tmp_path / "weights"), timeout_s=60)

    def update() -> None:
        train_one_step(engine)
        transport.update(engine.export_hf_weights(), old + 1, "abort")

    try:
        samples, reference = asyncio.run(generate_across_an_update(url, "abort", update))
        distances = check_spans(samples, reference, old, old + 1, engine)
        assert max(distances) < SAME, distances  # a new request: every key and value from the new weights
        assert check_servers(engine, [url], 1e-3, rank=0, when="after the update") < SAME
    finally:
        client.update_weights_from_disk(url, str(tiny_qwen3), original)
        client.flush_cache(url)
    assert client.weight_version(url) == original
    assert (served_logprobs(url, SEQUENCE) - before).abs().max() < 1e-6


def test_servers_without_the_flags_are_refused_with_the_fix(sglang_server) -> None:
    check_server_args([sglang_server.url], "abort")
    with pytest.raises(EngineError) as error:
        check_server_args([sglang_server.url], "in_place")
    message = str(error.value)
    assert f"{sglang_server.url} runs without --disable-radix-cache --disable-overlap-schedule" in message
    assert "--sglang-disable-radix-cache --sglang-disable-overlap-schedule --sglang-incremental-streaming-output" in (
        message
    )
