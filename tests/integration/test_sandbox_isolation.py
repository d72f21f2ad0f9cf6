"""The Python tool's sandbox: what its code can and cannot see (namespaces where the kernel allows them)."""

from __future__ import annotations

import asyncio
import os

import pytest

from plugins.tools import python_sandbox
from plugins.tools.python_sandbox import MAX_PROCS, isolation_prefix, run_python
from slime_like.core.secret import API_KEY_ENV

ISOLATED = "--mount-proc" in isolation_prefix()
PRIVATE_TMP = python_sandbox._MOUNTS in isolation_prefix()  # not when the interpreter lives under /tmp


def test_the_code_gets_no_part_of_the_runs_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, "sandbox-must-not-see-this")
    out = asyncio.run(run_python("import os\nprint(sorted(os.environ))"))
    assert API_KEY_ENV not in out and "sandbox-must-not-see-this" not in out


@pytest.mark.skipif(not ISOLATED, reason="unshare -rnmpf is not allowed on this machine")
def test_the_code_sees_no_other_process_and_a_private_tmp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, "sandbox-must-not-see-this")
    code = (
        "import os\n"
        "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "seen = any(b'sandbox-must-not' in open(f'/proc/{p}/environ', 'rb').read() for p in pids)\n"
        "print(len(pids), len(os.listdir('/tmp')), os.listdir('/dev/shm'), seen)"
    )
    pids, tmp_entries, shm, seen = asyncio.run(run_python(code)).splitlines()[1].split(" ", 3)
    assert (pids, shm, seen) == ("1", "[]", "False")
    if PRIVATE_TMP:  # else the host's /tmp stays: this interpreter lives there
        assert tmp_entries == "0"


@pytest.mark.skipif(os.geteuid() == 0, reason="the kernel exempts root from RLIMIT_NPROC, even in a user namespace")
def test_a_fork_bomb_stops_at_the_process_limit() -> None:
    code = (
        "import os, time\nn = 0\ntry:\n    while n < 200:\n        if os.fork() == 0:\n            time.sleep(2)\n"
        "            os._exit(0)\n        n += 1\nexcept OSError:\n    print('stopped at', n)"
    )
    out = asyncio.run(run_python(code))
    assert "stopped at" in out and int(out.split()[-1]) < MAX_PROCS


def test_a_file_over_the_size_limit_is_refused() -> None:
    out = asyncio.run(run_python("open('big', 'wb').write(b'x' * (2 << 20))"))
    assert "File too large" in out
