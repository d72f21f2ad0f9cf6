"""A two-turn chat agent as a program of its own, for plugins.agent_command: any Python with the openai SDK runs it.

    python two_turn_agent.py [--import MODULE ...] [TASK_FILE]      # without TASK_FILE: the task on stdin

The task is text, or a JSON list of chat messages. The agent asks the model (the OpenAI SDK reads OPENAI_BASE_URL and
OPENAI_API_KEY, which plugins.agent_command sets to the sample's session), then asks it to check its answer, and
writes the second reply to answer.txt in its working directory. versions.json records the versions of openai and of
each --import module (which venv it ran in: e.g. `--import verifiers` from .venv-verifiers). AGENT_EXTRA_BODY (JSON,
optional) goes with each call, e.g. {"regex": "[1-4]"} to steer a tiny model.

It runs outside the engine and imports nothing of it: only the standard library and its own venv's packages.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

FOLLOW_UP = "Check your answer and give the final one."


def task_messages(text: str) -> list[dict[str, Any]]:
    """The task as chat messages: a JSON list of them, or one user message of the text."""
    try:
        messages = json.loads(text)
    except ValueError:
        messages = None
    return messages if isinstance(messages, list) else [{"role": "user", "content": text}]


def main(argv: list[str] | None = None) -> int:
    """Two turns with the model; the final reply in answer.txt."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task_file", nargs="?", default=None)
    parser.add_argument("--import", dest="modules", action="append", default=[], help="a module to import first")
    args = parser.parse_args(argv)
    versions = {}
    for name in ["openai", *args.modules]:
        module = importlib.import_module(name)  # a framework that cannot load fails the agent here
        versions[name] = getattr(module, "__version__", "?")
    Path("versions.json").write_text(json.dumps(versions))

    from openai import OpenAI

    text = Path(args.task_file).read_text() if args.task_file else sys.stdin.read()
    messages = task_messages(text)
    extra_body = json.loads(os.environ.get("AGENT_EXTRA_BODY") or "{}")
    client = OpenAI(max_retries=0)  # base URL and key from the environment
    answer = ""
    for turn, follow_up in enumerate((FOLLOW_UP, None), 1):
        reply = client.chat.completions.create(model="policy", messages=messages, extra_body=extra_body)
        answer = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": answer})
        print(f"turn {turn}: {answer!r} ({reply.choices[0].finish_reason})", flush=True)
        if follow_up is None or reply.choices[0].finish_reason == "length":
            break
        messages.append({"role": "user", "content": follow_up})
    Path("answer.txt").write_text(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
