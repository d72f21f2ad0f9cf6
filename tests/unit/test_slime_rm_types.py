"""slime's rm_types gpqa, random and boxed_*: scored by hand-computed cases; ifbench refused naming why."""

from __future__ import annotations

import asyncio
import random
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest

from rollout.rewards import get_reward_function
from rollout.rm_hub.gpqa import answer_letter, gpqa_reward
from slime_like.arguments import parse_args
from slime_like.core.sample import Sample, Status


def _score(rm_type: str, response: str, label: Any, metadata: dict[str, Any] | None = None) -> float:
    args = Namespace(custom_rm_path=None, rm_type=rm_type)
    sample = Sample(prompt="q", response=response, label=label, metadata=metadata or {}, status=Status.COMPLETED)
    return asyncio.run(get_reward_function(args).compute(args, sample))


@pytest.mark.parametrize(
    ("response", "letters", "letter"),
    [
        ("<think>maybe A</think>The answer is C.", "ABCD", "C"),  # after </think>; slime's first pattern
        ("Option: b", "ABCD", "B"),  # the patterns ignore case
        ("B is correct", "ABCD", "B"),
        ("I pick D, not E", "ABCD", "D"),  # the last standalone capital that is an option (E is not, I is not)
        ("nothing here", "ABCD", None),
    ],
)
def test_answer_letter(response: str, letters: str, letter: str | None) -> None:
    assert answer_letter(response, letters) == letter


def test_gpqa_reward_by_hand() -> None:
    choices = ["1 mol", "2 mol", "3 mol", "4 mol"]
    assert gpqa_reward("The answer is B", "B") == 1.0  # one-letter label
    assert gpqa_reward("The answer is B", "C") == 0.0
    assert gpqa_reward("The answer is B", 1) == 1.0  # label as index: 1 -> B
    assert gpqa_reward("Final answer: C", "3 mol", {"choices": choices}) == 1.0  # label text -> its letter C
    assert gpqa_reward("The answer is A", "3 mol", {"choices": choices}) == 0.0
    assert gpqa_reward("it is 3 mol", "x", {"choices": choices, "correct_letter": "c"}) == 1.0  # the choice quoted
    assert gpqa_reward("The answer is C", "A", {"correct_letter": "C"}) == 1.0  # correct_letter wins over the label
    assert gpqa_reward(None, "A") == 0.0  # type: ignore[arg-type]
    meta = {"choices": choices}
    gpqa_reward("C", "3 mol", meta)
    assert meta == {"choices": choices}  # the sample's metadata is left as it was


def test_gpqa_and_boxed_as_rm_types() -> None:
    assert _score("gpqa", "<think>A?</think> So the answer is D", "D") == 1.0
    assert _score("boxed_gpqa", "A or B... \\boxed{B}", "B") == 1.0  # only the box is read: "B"
    assert _score("boxed_gpqa", "The answer is B", "B") == 0.0  # no box: scored on ""
    assert _score("boxed_math", "2 + 3 = \\boxed{5}, then 7", "5") == 1.0  # plain math would take 7
    assert _score("math", "2 + 3 = \\boxed{5}, then 7", "5") == 1.0  # (ours reads the box first as well)
    assert _score("boxed_math", "\\boxed{\\frac{1}{2}}", "\\frac{1}{2}") == 1.0  # nested braces
    assert _score("boxed_math", "5", "5") == 0.0  # no box
    assert _score("boxed_math", "\\boxed{5.0}", 5) == 1.0  # numerically
    assert _score("boxed_exact", "so \\boxed{ Paris }", "Paris") == 1.0
    # F1 of "the eiffel tower" vs "eiffel tower paris": articles dropped, 2 common of 2 and 3 tokens -> 0.8
    assert _score("boxed_f1", "\\boxed{the Eiffel Tower}", "Eiffel Tower Paris") == pytest.approx(0.8)


def test_random_is_zero_or_one_from_pythons_random() -> None:
    random.seed(7)
    got = [_score("random", "anything", "x") for _ in range(20)]
    random.seed(7)
    assert got == [float(random.randint(0, 1)) for _ in range(20)]
    assert set(got) == {0.0, 1.0}


def test_ifbench_is_refused_naming_why(base: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(base + ["--rm-type", "ifbench"])
    err = capsys.readouterr().err
    assert "--rm-type ifbench is not supported here: " in err and "not on PyPI" in err and "numpy==1.26.4" in err
    config = tmp_path / "eval.yaml"
    config.write_text("eval:\n  datasets:\n    - name: ifb\n      path: /x.jsonl\n      rm_type: ifbench\n")
    with pytest.raises(SystemExit):
        parse_args(base + ["--eval-config", str(config)])
    assert "rm_type 'ifbench' is not supported here: " in capsys.readouterr().err
    assert parse_args(base + ["--rm-type", "boxed_gpqa"]).rm_type == "boxed_gpqa"


def test_a_samples_metadata_rm_type_picks_its_builtin() -> None:
    # slime's async_rm: the sample's metadata["rm_type"] first, else --rm-type.
    assert _score("math", "The answer is B", "B", {"rm_type": "gpqa"}) == 1.0  # math alone would score 0
    assert _score("math", "The answer is B", "B") == 0.0
    assert _score("gpqa", "\\boxed{7}", "7", {"rm_type": "boxed_math"}) == 1.0
    with pytest.raises(ValueError, match="metadata rm_type 'ifbench' is not supported here"):
        _score("math", "x", "y", {"rm_type": "ifbench"})
    with pytest.raises(ValueError, match="metadata rm_type 'nope' is not a built-in reward here"):
        _score("math", "x", "y", {"rm_type": "nope"})


def test_a_failing_metadata_rm_type_fails_only_its_sample() -> None:
    args = Namespace(custom_rm_path=None, rm_type="math")
    good = Sample(prompt="q", response="\\boxed{3}", label="3", index=0, status=Status.COMPLETED)
    bad = Sample(prompt="q", response="x", label="3", index=1, metadata={"rm_type": "nope"}, status=Status.COMPLETED)
    counts: dict[str, int] = {}

    async def run() -> None:
        reward = get_reward_function(args)
        await reward.score_group(args, [good, bad], lambda k, n: counts.__setitem__(k, counts.get(k, 0) + n))
        await reward.close()

    asyncio.run(run())
    assert good.reward == 1.0 and bad.status == Status.FAILED and counts == {"reward_failed": 1}
    assert "not a built-in reward here" in bad.metadata["reward_error"]
