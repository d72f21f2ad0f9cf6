"""A weight-update phase hook (slime_like/trainer/weights/base.py HOOK_ENV) that SIGKILLs an engine at chosen phases.

UPDATE_FAULT_KILLS="2:start,4:sending" kills, at weight version 2's "start" and version 4's "sending", the engine
serving the update's last URL (its pid from UPDATE_FAULT_DIR/placement.json), waits until its port refuses, and
records the kill as UPDATE_FAULT_DIR/kill-<version>-<phase>.json.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit


def kill_at(phase: str, urls: list[str], version: int) -> None:
    """Kill the last engine when (version, phase) is planned, once."""
    planned = {tuple(item.split(":")) for item in os.environ.get("UPDATE_FAULT_KILLS", "").split(",") if item}
    out = Path(os.environ["UPDATE_FAULT_DIR"])
    record = out / f"kill-{version}-{phase}.json"
    if (str(version), phase) not in planned or record.exists():
        return
    url = urls[-1]
    engines = json.loads((out / "placement.json").read_text())["engines"]
    pid = next(e["pids"][0] for e in engines if e["url"] == url)
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
