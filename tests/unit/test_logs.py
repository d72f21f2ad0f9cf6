"""Logging set-up: one format, a file per process, quiet consoles on later ranks, handlers of others kept."""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from slime_like.core.logs import setup_logging


@pytest.fixture(autouse=True)
def restore_root() -> Iterator[None]:
    """Leave the root logger as the test found it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)
    logging.captureWarnings(False)


def emit_all() -> None:
    logging.getLogger("slime_like.run").info("ours at info")
    logging.getLogger("megatron.core.distributed").info("library at info")
    logging.getLogger("rollout.manager").warning("ours at warning")
    logging.getLogger("megatron.core.fusions").warning("library at warning")
    logging.getLogger("megatron.core.models").error("library at error")
    # What warnings.warn calls to show a warning (pytest's own warning capture would record a real warn call).
    warnings.showwarning("tokenizer has no pad token", UserWarning, "tokenization.py", 21)
    warnings.showwarning("Apex is not installed. Falling back to Torch Norm", UserWarning, "backends.py", 21)


def test_driver_console_and_file_share_one_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = setup_logging("driver", "info", tmp_path / "logs")
    emit_all()
    console = capsys.readouterr().err
    assert path == tmp_path / "logs" / "driver.log"
    text = path.read_text()
    for out in (console, text):
        for message in ("ours at info", "ours at warning", "library at warning", "library at error", "no pad token"):
            assert message in out
    # The fallback notes every CPU start raises, which ask nothing of the user, are in the file only.
    assert "Apex is not installed" in text and "Apex" not in console
    # A library's INFO lines (Megatron lists every parameter of a gradient bucket) only go to the file.
    assert "library at info" in text and "library at info" not in console
    line = next(x for x in text.splitlines() if "ours at info" in x)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d INFO driver slime_like\.run: ours at info", line)


def test_later_ranks_keep_library_notes_off_the_console(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    path = setup_logging("trainer", "INFO", tmp_path)
    emit_all()
    console = capsys.readouterr().err
    assert path == tmp_path / "trainer_rank1.log"
    # Console: our warnings and every error; the fallback notes every rank prints are rank 0's to show.
    assert "ours at warning" in console and "library at error" in console
    assert "ours at info" not in console and "library at warning" not in console and "no pad token" not in console
    # The file has everything at the level.
    text = path.read_text()
    assert all(m in text for m in ("ours at info", "library at warning", "no pad token", "Apex is not installed"))
    assert " trainer_rank1 " in text


def test_rank_zero_shows_everything(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("RANK", "0")
    setup_logging("trainer", "INFO", tmp_path)
    emit_all()
    assert "no pad token" in capsys.readouterr().err


@pytest.mark.parametrize(
    "message",
    [
        "Transformer Engine and Apex are not installed. Falling back to Torch optimizers.",
        "Apex is not installed. Falling back to Torch Norm",
        "`torch.distributed.reduce_scatter_tensor` is deprecated. Please use `torch.distributed.reduce_scatter_single`",
        "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed.",
        "full scope is deprecated. Use empty cuda_graph_scope to capture the whole layer.",
    ],
)
def test_expected_library_warnings_stay_in_the_file(message: str, tmp_path: Path, capsys) -> None:
    """Warnings of Megatron and torch that every CPU start raised (six Apex notes) and no user acts on."""
    path = setup_logging("driver", "INFO", tmp_path)
    warnings.showwarning(message, UserWarning, "lib.py", 1)
    assert message not in capsys.readouterr().err and message in path.read_text()


def test_calling_again_replaces_only_its_own_handlers(tmp_path: Path) -> None:
    root = logging.getLogger()
    foreign = logging.NullHandler()
    root.addHandler(foreign)
    setup_logging("driver", "INFO", tmp_path)
    setup_logging("driver", "WARNING", tmp_path)
    ours = [h for h in root.handlers if getattr(h, "_slime_like", False)]
    assert len(ours) == 2 and foreign in root.handlers and root.level == logging.WARNING
    root.removeHandler(foreign)


def test_unknown_level_names_the_flag() -> None:
    with pytest.raises(ValueError, match="--log-level 'LOUD'"):
        setup_logging("driver", "LOUD")
