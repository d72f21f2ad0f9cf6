"""sglang-router in front of two real SGLang workers: traffic reaches both, workers can be removed and added."""

from __future__ import annotations

import time

import pytest

from rollout.router import SGLangRouter
from rollout.sglang_client import generate
from rollout.sglang_server import SGLangServer
from slime_like.core.process import free_port

# Each worker's uvicorn access log has one such line per request it served: the workers' own proof of traffic.
SERVED = '"POST /generate HTTP/1.1" 200'


def served(server: SGLangServer) -> int:
    """How many /generate requests this worker has answered with 200."""
    return server.log_path.read_text(errors="replace").count(SERVED)


def send(router: SGLangRouter, n: int) -> None:
    """Send `n` distinct greedy requests through the router."""
    for i in range(n):
        out = generate(router.url, [5 + i, 17, 99, 3 * i + 1], {"max_new_tokens": 3, "temperature": 0.0})
        assert len(out["output_ids"]) >= 1


def wait_served(servers: list[SGLangServer], total: int, timeout: float = 10.0) -> list[int]:
    """The served counts once they add up to `total` (the access log line lands just after the answer)."""
    deadline = time.monotonic() + timeout
    while sum(served(s) for s in servers) < total and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.3)  # a request wrongly served twice would show up here
    return [served(s) for s in servers]


def test_router_lists_both_workers_healthy(router: SGLangRouter, workers: list[SGLangServer]) -> None:
    listed = {w["url"]: w["is_healthy"] for w in router.list_workers()}
    assert listed == {workers[0].url: True, workers[1].url: True}


def test_router_spreads_generate_over_both_workers(router: SGLangRouter, workers: list[SGLangServer]) -> None:
    before = [served(w) for w in workers]
    out = generate(router.url, [1, 2, 3], {"max_new_tokens": 4, "temperature": 0.0}, return_logprob=True)
    assert len(out["meta_info"]["output_token_logprobs"]) == 4  # log-probs pass through the router
    send(router, 7)
    after = wait_served(workers, sum(before) + 8)
    # Round robin: 8 requests, 4 each; the counts come from the workers' own logs.
    assert [a - b for a, b in zip(after, before, strict=True)] == [4, 4]


def test_remove_then_add_worker(router: SGLangRouter, workers: list[SGLangServer]) -> None:
    kept, moved = workers
    try:
        router.remove_worker(moved.url)
        assert [w["url"] for w in router.list_workers()] == [kept.url]
        before = [served(w) for w in workers]
        send(router, 4)
        after = wait_served(workers, sum(before) + 4)
        assert after == [before[0] + 4, before[1]], "a removed worker still received traffic"

        worker_id = router.add_worker(moved.url, timeout=60)
        assert {w["url"]: w["id"] for w in router.list_workers()}[moved.url] == worker_id
        send(router, 4)
        final = wait_served(workers, sum(after) + 4)
        assert sum(final) == sum(after) + 4 and final[1] > after[1], "the re-added worker received no traffic"
    finally:
        if moved.url not in [w["url"] for w in router.list_workers()]:
            router.add_worker(moved.url)  # leave the module's router as the fixture made it


def test_remove_unknown_worker_names_it(router: SGLangRouter) -> None:
    with pytest.raises(KeyError, match="http://127.0.0.1:1"):
        router.remove_worker("http://127.0.0.1:1")


def test_add_unreachable_worker_times_out_and_is_cancelled(router: SGLangRouter) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=dead.replace(".", r"\.")):
        router.add_worker(dead, timeout=3)
    assert time.monotonic() - start < 10
    assert dead not in [w["url"] for w in router.list_workers()]


def test_router_log_tail_has_no_colour_codes(router: SGLangRouter) -> None:
    assert "\x1b[" in router.process.log_path.read_text(errors="replace")  # the Rust logger colours its file
    tail = router.process.tail_log(20)
    assert "smg::" in tail and "\x1b[" not in tail
