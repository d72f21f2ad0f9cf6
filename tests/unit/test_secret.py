"""The per-run secret: made once, handed to every actor, sent only to our servers, kept off command lines."""

from __future__ import annotations

import asyncio
import importlib
import multiprocessing
import sys
from argparse import Namespace
from typing import Any

import pytest

from rollout.context import RolloutContext, running
from rollout.router import LAUNCH_ROUTER, SGLangRouter
from rollout.sglang_server import LAUNCH_FORKED_ON_CPU, SGLangServer
from slime_like.core import cluster, slime_finder
from slime_like.core.secret import (
    API_KEY_ENV,
    LAUNCH_WITH_KEY,
    api_key,
    auth_headers,
    ensure_api_key,
    new_api_key,
    same_origin,
)


@pytest.fixture
def no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process outside any run."""
    monkeypatch.delenv(API_KEY_ENV, raising=False)


def test_the_secret_is_made_once_and_then_kept(no_secret: None) -> None:
    assert api_key() is None and auth_headers() == {}
    key = ensure_api_key()
    assert len(key) == 64 and int(key, 16) >= 0  # 256 bits in hex
    assert ensure_api_key() == key == api_key()
    assert auth_headers() == {"Authorization": f"Bearer {key}"}


def test_new_secrets_never_start_with_a_dash() -> None:
    """A leading `-` made SGLang's and the router's parsers take the key for a flag (one run in 64 before)."""
    assert not any(new_api_key().startswith("-") for _ in range(2000))


def test_a_key_starting_with_a_dash_reaches_the_parser_as_a_value() -> None:
    """argparse, as SGLang's and sglang-router's launchers use it, reads the launcher's `--api-key=KEY` form."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--api-key")
    parser.add_argument("--port")
    assert parser.parse_args(["--port", "1", "--api-key=-Xy_z"]).api_key == "-Xy_z"


def test_a_secret_set_by_the_user_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, "mine")
    assert ensure_api_key() == "mine"


def test_every_actor_gets_the_secret_in_its_environment(no_secret: None) -> None:
    options = cluster.node_options("a" * 56, None)
    key = options["runtime_env"]["env_vars"][API_KEY_ENV]
    assert key == api_key()
    env = cluster.actor_env({"OMP_NUM_THREADS": "1"})
    assert env == {"OMP_NUM_THREADS": "1", API_KEY_ENV: key}  # the same secret for every actor of the run


@pytest.mark.parametrize(
    ("url", "ours"),
    [
        ("http://127.0.0.1:3000/generate", True),
        ("http://127.0.0.1:3001/generate", False),
        ("http://10.0.0.2:3000/generate", False),
        ("https://127.0.0.1:3000/generate", False),
        ("http://10.0.0.7:4000/flush_cache", True),
        ("http://api.example.com/v1/chat", False),
    ],
)
def test_same_origin(url: str, ours: bool) -> None:
    assert same_origin(url, ["http://127.0.0.1:3000", "10.0.0.7:4000", ""]) is ours


def test_the_server_command_keeps_the_secret_out_of_the_command_line(tmp_path: Any) -> None:
    server = SGLangServer(tmp_path, port=30000, device="cpu", api_key="s3cret")
    cmd, env = server.command()
    assert "s3cret" not in " ".join(cmd) and env[API_KEY_ENV] == "s3cret"
    assert cmd[1:4] == ["-c", LAUNCH_FORKED_ON_CPU, "sglang.launch_server"]
    cmd, env = SGLangServer(tmp_path, port=30000, device="cuda", api_key="s3cret").command()
    assert cmd[1:4] == ["-c", LAUNCH_WITH_KEY, "sglang.launch_server"] and env[API_KEY_ENV] == "s3cret"
    router = SGLangRouter(["http://127.0.0.1:30000"], port=30001, extra_args=["--prometheus-port", "1"], api_key="s3")
    assert "s3" not in router.command() and router.command()[3] == "sglang_router.launch_router"


def test_without_a_secret_the_commands_are_plain(no_secret: None, tmp_path: Any) -> None:
    cmd, env = SGLangServer(tmp_path, port=30000, device="cuda").command()
    assert cmd[1:3] == ["-m", "sglang.launch_server"] and API_KEY_ENV not in env
    # On CPU through the forking launcher, told there is no key (whatever the caller's environment holds).
    cmd, env = SGLangServer(tmp_path, port=30000, device="cpu").command()
    assert cmd[1:4] == ["-c", LAUNCH_FORKED_ON_CPU, "sglang.launch_server"] and env[API_KEY_ENV] == ""


def test_the_cpu_launcher_starts_sglang_s_children_by_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    """LAUNCH_FORKED_ON_CPU: SGLang's `set_start_method("spawn", force=True)` selects fork (rollout/sglang_server.py
    says why); no key in the environment adds no --api-key."""
    seen: dict[str, Any] = {}
    before, set_start_method = multiprocessing.get_start_method(), multiprocessing.set_start_method
    monkeypatch.setenv(API_KEY_ENV, "")
    monkeypatch.setattr("sys.argv", ["-c", "some.module", "--port", "1"])
    monkeypatch.setattr(multiprocessing, "set_start_method", set_start_method)  # the launcher's patch is undone

    def run_module(module: str, **kw: Any) -> None:
        multiprocessing.set_start_method("spawn", force=True)  # what SGLang's engine does
        seen.update(module=module, argv=list(sys.argv), method=multiprocessing.get_start_method())

    monkeypatch.setattr("runpy.run_module", run_module)
    try:
        exec(LAUNCH_FORKED_ON_CPU, {})
    finally:
        set_start_method(before, force=True)
    assert seen == {"module": "some.module", "argv": ["some.module", "--port", "1"], "method": "fork"}


def test_the_launcher_adds_the_secret_inside_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """LAUNCH_WITH_KEY run on a stand-in module: it sees the key as `--api-key`, from the environment."""
    seen: dict[str, Any] = {}
    monkeypatch.setenv(API_KEY_ENV, "k1")
    monkeypatch.setattr("sys.argv", ["-c", "some.module", "--port", "1"])
    monkeypatch.setattr(
        "runpy.run_module", lambda module, **kw: seen.update(module=module, argv=list(__import__("sys").argv))
    )
    exec(LAUNCH_WITH_KEY, {})
    assert seen == {"module": "some.module", "argv": ["some.module", "--port", "1", "--api-key=k1"]}


def test_the_router_launcher_adds_the_secret_and_leaves_the_python_balancer_unimported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """LAUNCH_ROUTER: sglang-router's Python balancer (only --mini-lb uses it; its import pulls in sglang, torch and
    torchvision, seconds) stays a stand-in that imports it only when called; the key is added as LAUNCH_WITH_KEY
    adds it."""
    seen: dict[str, Any] = {}
    monkeypatch.setenv(API_KEY_ENV, "k3")
    monkeypatch.setattr("sys.argv", ["-c", "sglang_router.launch_router", "--port", "1"])
    monkeypatch.delitem(sys.modules, "sglang_router.mini_lb", raising=False)  # put back as it was afterwards

    def run_module(module: str, **kw: Any) -> None:
        seen.update(module=module, argv=list(sys.argv), mini_lb=sys.modules["sglang_router.mini_lb"])

    monkeypatch.setattr("runpy.run_module", run_module)
    exec(LAUNCH_ROUTER, {})
    stand_in = seen.pop("mini_lb")
    assert seen == {
        "module": "sglang_router.launch_router",
        "argv": ["sglang_router.launch_router", "--port", "1", "--api-key=k3"],
    }
    assert callable(stand_in.MiniLoadBalancer) and getattr(stand_in, "__file__", None) is None
    router = SGLangRouter(["http://127.0.0.1:30000"], port=30001, extra_args=["--prometheus-port", "1"], api_key="")
    assert router.command()[1:4] == ["-c", LAUNCH_ROUTER, "sglang_router.launch_router"]


def test_slime_http_utils_send_the_secret_to_our_router_only(monkeypatch: pytest.MonkeyPatch) -> None:
    slime_finder.install()  # as a plugin sees it: one copy, named slime.* (tests/unit/test_slime_compat.py)
    http_utils = importlib.import_module("slime.utils.http_utils")
    monkeypatch.setenv(API_KEY_ENV, "k2")
    sent: list[tuple[str, Any]] = []

    async def fake_send(session: Any, method: str, url: str, payload: Any, headers: Any) -> Any:
        sent.append((url, headers))
        return {}

    monkeypatch.setattr(http_utils, "_send", fake_send)

    async def main() -> None:
        ctx = RolloutContext(Namespace(), None, "http://127.0.0.1:3000", None, asyncio.Semaphore(2))  # type: ignore[arg-type]
        ctx.server_urls = ["http://127.0.0.1:4000"]
        with running(ctx):
            await http_utils.post("http://127.0.0.1:3000/generate", {})
            await http_utils.get("http://127.0.0.1:4000/model_info")
            await http_utils.post("http://rm.example.com:8000/score", {}, headers={"X": "1"})

    asyncio.run(main())
    bearer = {"Authorization": "Bearer k2"}
    assert sent == [
        ("http://127.0.0.1:3000/generate", bearer),
        ("http://127.0.0.1:4000/model_info", bearer),
        ("http://rm.example.com:8000/score", {"X": "1"}),
    ]


def test_a_checkpoint_with_its_own_config_code_is_trusted(tmp_path: Any) -> None:
    """Kimi-K2's and MiMo's config.json name their code (auto_map): SGLang loads it only with --trust-remote-code,
    as the trainer reads it; other checkpoints start without it."""
    import json

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mimo", "auto_map": {"AutoConfig": "c.C"}}))
    assert "--trust-remote-code" in SGLangServer(tmp_path, port=30000, device="cpu").command()[0]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert "--trust-remote-code" not in SGLangServer(tmp_path, port=30000, device="cpu").command()[0]
