"""A weight-update phase hook (slime_like/trainer/weights/base.py HOOK_ENV) that SIGKILLs an engine at chosen phases.

UPDATE_FAULT_KILLS="2:start,4:sending" kills, at weight version 2's "start" and version 4's "sending", the engine
serving the update's last URL (its pid from UPDATE_FAULT_DIR/placement.json), waits until its port refuses, and
records the kill as UPDATE_FAULT_DIR/kill-<version>-<phase>.json; "5:sent:first" kills the engine of its first URL
(kill-5-sent-first.json). "3:paused:teacher" kills the engine model group "teacher" (--sglang-config) has in its
router at version 3's pause (recorded as kill-3-paused-teacher.json).

`generate_with_every_engine` is the default generate function, started once the router lists every engine.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

from rollout import sglang_client as client
from rollout.generate import generate


def kill_at(phase: str, urls: list[str], version: int) -> None:
    """Kill the last engine when (version, phase) is planned, once; (version, phase, "first"): the first;
    (version, phase, group): a model group's engine."""
    planned = [item.split(":") for item in os.environ.get("UPDATE_FAULT_KILLS", "").split(",") if item]
    out = Path(os.environ["UPDATE_FAULT_DIR"])
    for item in planned:
        if item[:2] != [str(version), phase] or (out / f"kill-{'-'.join(item)}.json").exists():
            continue
        placement = json.loads((out / "placement.json").read_text())
        group = item[2] if len(item) == 3 and item[2] != "first" else None
        if group:  # the engine its router lists now (placement.json keeps the pids of the first start)
            router, deadline = placement["model_groups"][group]["router"], time.monotonic() + 120
            while not (workers := client.list_workers(router)) and time.monotonic() < deadline:
                time.sleep(0.5)  # still restarting after an earlier kill
            url = workers[0]["url"]
            pid = _listening(urlsplit(url).port)
        else:
            url = urls[0] if item[2:] == ["first"] else urls[-1]
            pid = next(e["pids"][0] for e in placement["engines"] if e["url"] == url)
        _kill(url, pid, urls, out / f"kill-{'-'.join(item)}.json")


def _listening(port: int | None) -> int:
    """The pid of the process listening on `port` here."""
    import psutil

    return next(c.pid for c in psutil.net_connections("tcp") if c.laddr.port == port and c.status == "LISTEN")


def _kill(url: str, pid: int, urls: list[str], record: Path) -> None:
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    address = urlsplit(url)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # dead once its port refuses: the phase after this one fails for sure
        try:
            socket.create_connection((address.hostname, address.port), timeout=1).close()
        except OSError:
            break
        time.sleep(0.2)
    record.write_text(json.dumps({"url": url, "pid": pid, "urls": urls, "refused_after_s": time.monotonic() - start}))


async def generate_with_every_engine(ctx, sample, params):
    """The default generate, once the router lists every engine (--rollout-num-gpus of them; at most 120 s): an
    engine restarted after a kill is back in service between two weight updates, so in a delta weight sync run it
    was caught up (rollout/catch_up.py), not brought in by the next update."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if len(await asyncio.to_thread(client.list_workers, ctx.router_url)) >= ctx.args.rollout_num_gpus:
            break
        await asyncio.sleep(0.5)
    return await generate(ctx, sample, params)
