"""Write the CPU demo's verifiable-reward data: small additions 'a+b=' with the sum as label.

Files: train.jsonl (RL prompts), eval.jsonl (held-out prompts), sft.jsonl (prompt + answer for a warm start).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def make_demo_data(out: str | Path, max_operand: int = 19, eval_fraction: float = 0.2, seed: int = 0) -> Path:
    """Split all problems a+b (0 <= a, b <= max_operand) into train and held-out eval prompts."""
    rng = random.Random(seed)
    problems = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    rng.shuffle(problems)
    n_eval = int(len(problems) * eval_fraction)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    def write(name: str, rows: list[dict]) -> None:
        with (out / name).open("w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)

    rows = [{"prompt": f"{a}+{b}=", "label": str(a + b)} for a, b in problems]
    write("eval.jsonl", rows[:n_eval])
    write("train.jsonl", rows[n_eval:])
    write("sft.jsonl", [{"prompt": r["prompt"], "response": r["label"]} for r in rows[n_eval:]])
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--max-operand", type=int, default=19)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print(make_demo_data(a.out, a.max_operand, seed=a.seed))
