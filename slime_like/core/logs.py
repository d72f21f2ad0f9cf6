"""Logging, set up once in every process of a run: one format, a file per process, the console by role.

Each entry point and each Ray actor calls `setup_logging` first. The driver, the rollout manager and
trainer rank 0 log our records to the console at --log-level and libraries' from WARNING up (Ray
forwards an actor's console to the driver); the other trainer ranks show only our warnings and every
error there, so a message every rank emits is shown once per run, by rank 0; library warnings every CPU start
raises and no user acts on (Megatron's "Apex is not installed" notes) stay off the console. Every process writes
everything at --log-level to `<output-dir>/logs/<role>.log`.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(role)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
OUR_PACKAGES = ("slime_like", "rollout", "buffer", "plugins", "tools", "__main__")


class _Role(logging.Filter):
    """Stamps every record with the process's role (driver, rollout, trainer_rank0, ...)."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def filter(self, record: logging.LogRecord) -> bool:
        record.role = self.role
        return True


# Library warnings every start of the CPU path raises, none of which asks the user to act: Megatron's notes that
# it runs without Apex and Transformer Engine (six of them, one per module that checks), that its own default
# cuda_graph_scope is deprecated (mbridge builds a config with it before ours), and torch's deprecation notes on
# collectives and `.grad` reads inside Megatron. They stay in the log file, off the console.
EXPECTED_LIBRARY_WARNINGS = re.compile(
    r"(Transformer Engine and )?Apex (is|are) not installed"
    r"|`torch\.distributed\.\w+` is deprecated"
    r"|The \.grad attribute of a Tensor that is not a leaf Tensor"
    r"|full scope is deprecated\. Use empty cuda_graph_scope"
)


class _Console(logging.Filter):
    """Lets through our own records and libraries' records from `library_level` up (the rest stay in the file),
    except the expected library warnings."""

    def __init__(self, library_level: int) -> None:
        super().__init__()
        self.library_level = library_level

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "py.warnings" and EXPECTED_LIBRARY_WARNINGS.search(record.getMessage()):
            return False
        return record.levelno >= self.library_level or record.name.split(".")[0] in OUR_PACKAGES


def setup_logging(
    role: str, level: str = "INFO", log_dir: str | Path | None = None, quiet: bool | None = None
) -> Path | None:
    """Configure this process's root logger; returns the log file (under `log_dir`, named after `role`), if any.

    In a process with a RANK (trainer actors, torchrun workers) the role gets a `_rank<N>` suffix, and
    `quiet` defaults to true on ranks after the first: their console keeps to our own warnings and every
    error. Calling it again replaces only the handlers it added before (a test runner's stay).
    """
    if level.upper() not in LEVELS:
        raise ValueError(f"--log-level {level!r}: choose one of {', '.join(LEVELS)}")
    rank = os.environ.get("RANK")
    if rank is not None:
        role = f"{role}_rank{rank}"
        quiet = int(rank) > 0 if quiet is None else quiet
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_slime_like", False)]:
        root.removeHandler(handler)
        handler.close()
    formatter = logging.Formatter(FORMAT, DATE_FORMAT)
    console = logging.StreamHandler(sys.stderr)
    console.setLevel("WARNING" if quiet else level.upper())
    # Libraries' INFO lines (Megatron lists every parameter of a gradient bucket) stay in the file.
    console.addFilter(_Console(logging.ERROR if quiet else logging.WARNING))
    handlers: list[logging.Handler] = [console]
    path = None
    if log_dir is not None:
        path = Path(log_dir) / f"{role}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        file = logging.FileHandler(path)
        file.setLevel(level.upper())
        handlers.append(file)
    for handler in handlers:
        handler._slime_like = True  # type: ignore[attr-defined]
        handler.addFilter(_Role(role))
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(level.upper())
    # warnings.warn from libraries (Megatron's fallback notes among them) go through the same handlers. Off and
    # on again: captureWarnings(True) does nothing when it believes it is on, also after something (a test
    # runner's catch_warnings) put the original warnings.showwarning back.
    logging.captureWarnings(False)
    logging.captureWarnings(True)
    return path
