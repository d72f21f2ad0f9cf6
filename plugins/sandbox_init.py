"""The first process of a local sandbox (plugins/local_sandbox.py), run inside it by the system's python3 (stdlib only).

It does two jobs for the host, which talks to it over its stdin (requests) and stdout (answers), one JSON object a
line, each answer carrying its request's "id":
- runs what the host asks: {"op": "exec", "cmd", "env", "cwd", "timeout"} -> {"rc", "stdout", "stderr",
  "timed_out"} (bash -c, in a session of its own, killed with its whole group at the timeout); {"op": "write",
  "path", "data" (base64)} -> {}; {"op": "read", "path"} -> {"data"} (base64; null when it cannot be read);
- bridges the run's endpoint into the sandbox's network namespace, which has nothing but its own loopback: for each
  port P in argv[1:], it listens on 127.0.0.1:P and pipes each connection to the unix socket /run/slime/port-P.sock,
  which the host serves by connecting to its own 127.0.0.1:P. No other address is reachable.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sys

CTL_DIR = "/run/slime"
OUTPUT_LIMIT = 8 << 20  # bytes kept of a command's stdout, and of its stderr


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy `reader` to `writer` until either side closes (one direction of a bridged connection)."""
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


def _bridge(port: int):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(f"{CTL_DIR}/port-{port}.sock")
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return handle


async def _read_capped(stream: asyncio.StreamReader) -> bytes:
    data = bytearray()
    while chunk := await stream.read(1 << 16):
        if len(data) < OUTPUT_LIMIT:
            data += chunk[: OUTPUT_LIMIT - len(data)]
    return bytes(data)


async def _exec(req: dict) -> dict:
    env = {**BASE_ENV, **(req.get("env") or {})}
    proc = await asyncio.create_subprocess_exec(
        "/bin/bash", "-c", req["cmd"],
        cwd=req.get("cwd") or env.get("HOME", "/"),
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    readers = [asyncio.ensure_future(_read_capped(proc.stdout)), asyncio.ensure_future(_read_capped(proc.stderr))]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + float(req.get("timeout") or 120)
    timed_out = False
    # Polled: proc.wait() also waits for the pipes, which a child left in the background may hold open.
    while proc.returncode is None:
        if loop.time() >= deadline:
            timed_out = True
            break
        await asyncio.sleep(0.02)
    if timed_out:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await proc.wait()
    done, _ = await asyncio.wait(readers, timeout=1.0)  # a background child may keep the pipes open: no waiting
    out, err = (r.result() if r in done else b"" for r in readers)
    for r in readers:
        r.cancel()
    return {"rc": proc.returncode, "stdout": out.decode("utf-8", "replace"), "stderr": err.decode("utf-8", "replace"),
            "timed_out": timed_out}  # fmt: skip


def _write(req: dict) -> dict:
    path = req["path"]
    os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
    with open(path, "wb") as f:
        f.write(base64.b64decode(req["data"]))
    return {}


def _read(req: dict) -> dict:
    try:
        with open(req["path"], "rb") as f:
            return {"data": base64.b64encode(f.read()).decode()}
    except OSError as exc:
        return {"data": None, "reason": str(exc)}


async def _serve(req: dict, out) -> None:
    try:
        if req["op"] == "exec":
            answer = await _exec(req)
        elif req["op"] == "write":
            answer = _write(req)
        elif req["op"] == "read":
            answer = _read(req)
        else:
            answer = {"error": f"unknown op {req['op']!r}"}
    except Exception as exc:  # the host gets the reason; the sandbox goes on
        answer = {"error": f"{type(exc).__name__}: {exc}"}
    out.write((json.dumps({"id": req["id"], **answer}) + "\n").encode())
    out.flush()


async def main(ports: list[int]) -> None:
    for port in ports:
        await asyncio.start_server(_bridge(port), "127.0.0.1", port)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 30)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout.buffer
    out.write(b'{"ready": true}\n')
    out.flush()
    tasks = set()
    while line := await reader.readline():
        task = asyncio.ensure_future(_serve(json.loads(line), out))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    # The host closed our stdin: the sandbox is over (the host kills what is left).


BASE_ENV = {k: v for k, v in os.environ.items()}

if __name__ == "__main__":
    asyncio.run(main([int(p) for p in sys.argv[1:]]))
