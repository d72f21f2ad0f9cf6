"""A generate function written as slime's examples/coding_agent_rl drives `slime.agent`: a singleton adapter served
from its own thread (`run_app_in_thread`), a session per sample, an agent that talks HTTP to it with the sid as its
key, then `finish_session` -> one sample per branch. Even samples speak OpenAI (the first turn through /v1/responses),
odd ones Anthropic. The agent answers, continues, then goes back to its first answer and tries a second continuation:
a fork."""

import secrets

import aiohttp
from slime.agent.adapters import AnthropicAdapter, OpenAIAdapter
from slime.agent.aiohttp_threaded import FilteredAccessLogger, run_app_in_thread
from slime.utils.misc import SingletonMeta
from slime.utils.processing_utils import load_tokenizer
from slime.utils.types import Sample

LATE: list = []  # (url, sid, body) of finished sessions, for calls after the end


class _AdapterService(metaclass=SingletonMeta):
    def __init__(self, args) -> None:
        tokenizer = load_tokenizer(args.hf_checkpoint)
        url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
        self.adapters = {}
        self.urls = {}
        for name, cls in (("openai", OpenAIAdapter), ("anthropic", AnthropicAdapter)):
            adapter = cls(tokenizer=tokenizer, sglang_url=url, fork_threshold_tokens=None)
            handle = run_app_in_thread(
                adapter.app,
                host="127.0.0.1",
                port=0,
                thread_name=f"{name}-adapter",
                runner_kwargs={"handler_cancellation": True, "access_log_class": FilteredAccessLogger},
            )
            self.adapters[name], self.urls[name] = adapter, f"http://127.0.0.1:{handle.port}"


async def _openai_turn(http, url, sid, messages):
    if len(messages) == 1:  # the first turn through the Responses API (today's Codex CLI speaks only that)
        body = {"model": "m", "input": messages, "max_output_tokens": 6}
        async with http.post(f"{url}/v1/responses", json=body, headers={"Authorization": f"Bearer {sid}"}) as r:
            assert r.status == 200, await r.text()
            output = (await r.json())["output"]
            return "".join(part["text"] for item in output for part in item.get("content") or [])
    body = {"model": "m", "messages": messages, "max_tokens": 6}
    async with http.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {sid}"}) as r:
        assert r.status == 200, await r.text()
        return (await r.json())["choices"][0]["message"]["content"] or ""


async def _anthropic_turn(http, url, sid, messages):
    body = {"model": "m", "max_tokens": 6, "system": "be brief", "messages": messages, "stream": len(messages) > 1}
    async with http.post(f"{url}/v1/messages", json=body, headers={"Authorization": f"Bearer {sid}"}) as r:
        assert r.status == 200, await r.text()
        if not body["stream"]:
            return "".join(b["text"] for b in (await r.json())["content"] if b["type"] == "text")
        text = await r.text()
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        assert '"message_stop"' in events[-1]
        import json

        return "".join(json.loads(e)["delta"].get("text", "") for e in events if '"content_block_delta"' in e)


async def generate(args, base_sample: Sample, sampling_params):
    state = _AdapterService(args)
    kind = "openai" if base_sample.index % 2 == 0 else "anthropic"
    adapter, url = state.adapters[kind], state.urls[kind]
    turn = _openai_turn if kind == "openai" else _anthropic_turn
    sid = base_sample.session_id = f"{base_sample.index}-{secrets.token_hex(16)}"
    adapter.open_session(sid, sampling_defaults=sampling_params)
    question = [{"role": "user", "content": "What is 6 times 7?"}]
    async with aiohttp.ClientSession(trust_env=False) as http:
        first = await turn(http, url, sid, question)
        history = [*question, {"role": "assistant", "content": first}]
        await turn(http, url, sid, [*history, {"role": "user", "content": "go on"}])
        await turn(http, url, sid, [*history, {"role": "user", "content": "try again"}])  # the fork
    samples = await adapter.finish_session(sid, base_sample=base_sample, reward=1.0, extra_metadata={"kind": kind})
    LATE.append((url, sid, kind))
    return samples
