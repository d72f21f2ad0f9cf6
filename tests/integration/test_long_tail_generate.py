"""plugins.long_tail_generate against the session's real SGLang server: exact lengths, the answer's cut, eval."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer

from rollout.manager import RolloutManager
from rollout.sglang_server import SGLangServer
from slime_like.arguments import parse_args
from slime_like.core.sample import Status

BUDGET, FACTOR = 4, 3
# Half of the tiny model's vocabulary ends an answer, so most responses have a stop token in their budget.
STOPS = list(range(0, 256, 2))


def test_lengths_cut_and_eval(tiny_qwen3: Path, sglang_server: SGLangServer, tmp_path: Path) -> None:
    rows = [{"prompt": f"{a}+{a}=", "label": str(2 * a), "metadata": {"response_len_factor": FACTOR if a == 0 else 1}}
            for a in range(4)]  # fmt: skip
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = parse_args(
        [
            "--hf-checkpoint", str(tiny_qwen3), "--prompt-data", str(tmp_path / "train.jsonl"),
            "--input-key", "prompt", "--label-key", "label", "--rollout-batch-size", "4",
            "--n-samples-per-prompt", "4", "--num-rollout", "1", "--rollout-max-response-len", str(BUDGET),
            "--rollout-stop-token-ids", *map(str, STOPS), "--rm-type", "math",
            "--custom-generate-function-path", "plugins.long_tail_generate.generate",
            "--eval-prompt-data", str(tmp_path / "train.jsonl"), "--eval-temperature", "0",
            "--save-debug-rollout-data", "--output-dir", str(tmp_path / "out"),
        ]
    )  # fmt: skip
    m = RolloutManager(args, server_urls=[sglang_server.url], router_url=sglang_server.url)
    try:
        groups, _ = m.generate(0)
        m.evaluate(0)
    finally:
        m.shutdown()
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    stops = set(STOPS) | {tok.eos_token_id}
    cut = 0
    for sample in (s for g in groups for s in g):
        budget = BUDGET * (FACTOR if sample.prompt == "0+0=" else 1)
        assert sample.response_length == budget == len(sample.rollout_log_probs) == len(sample.loss_mask)
        response = sample.tokens[-budget:]
        end = next((i + 1 for i, t in enumerate(response) if t in stops), None)
        if end is None:  # no stop token: scored on everything and trained on everything, as plain sampling
            assert sample.status == Status.TRUNCATED and sample.loss_mask == [1] * budget
            continue
        cut += 1
        assert sample.status == Status.COMPLETED and sample.metadata["answer_tokens"] == end
        assert sample.loss_mask == [1] * end + [0] * (budget - end)
        assert sample.response == tok.decode(response[:end], skip_special_tokens=False)
    assert cut > 0
    # Eval samples use the default generate function: within the plain budget, ending at their first stop token.
    dumped = (tmp_path / "out" / "rollouts" / "eval_000000.jsonl").read_text().splitlines()
    assert len(dumped) == len(rows)
    for sample in map(json.loads, dumped):
        response = sample["tokens"][len(sample["tokens"]) - sample["response_length"] :]
        assert 0 < len(response) <= BUDGET and not stops & set(response[:-1])
        assert (response[-1] in stops) == (sample["status"] == "completed")
