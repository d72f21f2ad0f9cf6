"""The task of scripts/run-distill-smollm2-cpu.sh: name a country's capital. Writes its data; scores the answers.

Example: python tools/make_student_task.py --out /tmp/capitals   (train.jsonl, heldout.jsonl)
         python tools/make_student_task.py --out /tmp/capitals --score-server http://127.0.0.1:13141 --tokenizer DIR
The countries are those whose capital SmolLM2-135M-Instruct (fp32, greedy) names when asked "What is the capital
of X?" (58 of the 80 tried); the student of tools/make_student.py names 1 of the 80. `reward_func` is the run's
--custom-rm-path: a training sample gets the teacher's log-probs of its response (slime's on-policy distillation
reward) and its task score; an eval sample is only scored (the teacher is not asked). `post_process_rewards` is
slime's (training rewards 0.0: the signal is the teacher's KL alone) but keeps the task scores as the raw rewards,
so rollout/reward_mean reports the student's score on its own samples.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

CAPITALS = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Japan", "Tokyo"), ("Russia", "Moscow"), ("Egypt", "Cairo"),
    ("China", "Beijing"), ("England", "London"), ("Greece", "Athens"), ("Canada", "Ottawa"), ("Austria", "Vienna"),
    ("Ireland", "Dublin"), ("Norway", "Oslo"), ("Sweden", "Stockholm"), ("Poland", "Warsaw"), ("Kenya", "Nairobi"),
    ("Peru", "Lima"), ("Cuba", "Havana"), ("Thailand", "Bangkok"), ("Hungary", "Budapest"),
    ("Netherlands", "Amsterdam"), ("India", "New Delhi"), ("Pakistan", "Islamabad"), ("Iran", "Tehran"),
    ("Iraq", "Baghdad"), ("Syria", "Damascus"), ("Lebanon", "Beirut"), ("Israel", "Jerusalem"),
    ("Saudi Arabia", "Riyadh"), ("Afghanistan", "Kabul"), ("Indonesia", "Jakarta"), ("Philippines", "Manila"),
    ("South Korea", "Seoul"), ("North Korea", "Pyongyang"), ("Nepal", "Kathmandu"), ("Bangladesh", "Dhaka"),
    ("Sri Lanka", "Colombo"), ("Australia", "Canberra"), ("New Zealand", "Wellington"), ("Chile", "Santiago"),
    ("Mexico", "Mexico City"), ("Nigeria", "Abuja"), ("Ghana", "Accra"), ("Ethiopia", "Addis Ababa"),
    ("Tunisia", "Tunis"), ("Libya", "Tripoli"), ("Sudan", "Khartoum"), ("Uganda", "Kampala"),
    ("Scotland", "Edinburgh"), ("Wales", "Cardiff"), ("Romania", "Bucharest"), ("Bulgaria", "Sofia"),
    ("Croatia", "Zagreb"), ("Czech Republic", "Prague"), ("Latvia", "Riga"), ("Lithuania", "Vilnius"),
    ("Qatar", "Doha"), ("Malaysia", "Kuala Lumpur"), ("Singapore", "Singapore"),
]  # fmt: skip


def row(country: str, capital: str) -> dict[str, Any]:
    """One prompt in chat form (the run passes --apply-chat-template) with its label."""
    return {"messages": [{"role": "user", "content": f"What is the capital of {country}?"}], "label": capital}


def write_data(out: Path, heldout: int, seed: int = 0) -> tuple[Path, Path]:
    """train.jsonl and heldout.jsonl: a seeded split of the countries, `heldout` of them never trained on."""
    if not 0 <= heldout < len(CAPITALS):
        raise ValueError(f"--heldout {heldout}: choose 0..{len(CAPITALS) - 1}")
    pairs = list(CAPITALS)
    random.Random(seed).shuffle(pairs)
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "train.jsonl", out / "heldout.jsonl"
    for path, part in zip(paths, (pairs[heldout:], pairs[:heldout]), strict=True):
        path.write_text("".join(json.dumps(row(*p)) + "\n" for p in part))
    return paths


def score(response: str, label: str) -> float:
    """1.0 when the response names the capital (case-insensitive), else 0.0."""
    return float(label.lower() in response.lower())


def slime_opd() -> Any:
    """slime's slime.rollout.on_policy_distillation (our adapter of it: slime_like/compat)."""
    from slime_like.core.slime_finder import install

    install()  # makes `slime` importable as our adapters when the real slime is absent
    import slime.rollout.on_policy_distillation as opd

    return opd


async def reward_func(args: Any, sample: Any, **kwargs: Any) -> float:
    """The task score; a training sample also gets the teacher's log-probs (slime's OPD reward at --rm-url)."""
    if "eval_dataset" not in sample.metadata:  # rollout/evaluation.py marks eval samples
        await slime_opd().reward_func(args, sample)
    return score(sample.response, str(sample.label))


def post_process_rewards(args: Any, samples: list[Any], **kwargs: Any) -> tuple[list[float], list[float]]:
    """slime's OPD post-process (every sample trains on reward 0.0), with the task scores kept as the raw rewards
    that rollout/reward_mean reports (slime's own post-process reports its zeros there)."""
    _, rewards = slime_opd().post_process_rewards(args, samples, **kwargs)
    return [float(s.reward) for s in samples], rewards


def server_score(url: str, tokenizer_dir: Path, path: Path, max_new_tokens: int = 12) -> float:
    """Greedy score of the SGLang server at `url` on the prompts of `path` (e.g. the teacher's, for reference)."""
    import urllib.request

    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    texts = [tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False) for r in rows]
    body = {"text": texts, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens}}
    request = urllib.request.Request(f"{url}/generate", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=900) as answer:
        outputs = json.load(answer)
    return sum(score(o["text"], r["label"]) for o, r in zip(outputs, rows, strict=True)) / len(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the tool."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument("--heldout", type=int, default=16, help="countries left out of training, evaluated apart")
    p.add_argument("--seed", type=int, default=0, help="seed of the split")
    p.add_argument("--score-server", default=None, help="also print this SGLang server's greedy score on the data")
    p.add_argument("--tokenizer", default=None, help="with --score-server: the HF directory whose chat template to use")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Write the data and print its files (or, with --score-server, the server's score on each)."""
    args = parse_args(argv)
    for path in write_data(Path(args.out), args.heldout, args.seed):
        if args.score_server is None:
            print(path)
        else:
            if args.tokenizer is None:
                raise SystemExit("--score-server needs --tokenizer: the served model's HF directory")
            print(f"{path.stem} {server_score(args.score_server, Path(args.tokenizer), path):.2f}")


if __name__ == "__main__":
    main()
