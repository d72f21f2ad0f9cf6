"""plugins/reward_models.py without a server: the group lookup's errors, the refused Qwen2/Qwen3 classifier heads
(SGLang would serve a random score bias), and the verdict prompt's tokens. The served rewards themselves are checked
against transformers in tests/integration/test_reward_model_served.py."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from plugins import reward_models as rm
from slime_like.core.sample import Sample


def checkpoint(root: Path, name: str, arch: str, tensors: dict[str, torch.Tensor]) -> str:
    path = root / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2", "architectures": [arch]}))
    save_file(tensors, str(path / "model.safetensors"))
    return str(path)


def test_a_missing_group_names_the_fix(tmp_path: Path) -> None:
    policy = checkpoint(tmp_path, "policy", "Qwen2ForCausalLM", {"w": torch.zeros(1)})
    with pytest.raises(rm.RewardModelError, match="no --sglang-config"):
        rm.model_path(Namespace(sglang_config=None), "judge")
    config = tmp_path / "groups.yaml"
    config.write_text("sglang:\n  - name: actor\n    server_groups: [{worker_type: regular, num_gpus: 1}]\n")
    args = Namespace(hf_checkpoint=policy, rollout_num_gpus=1, rollout_num_gpus_per_engine=1, sglang_config=str(config))
    with pytest.raises(rm.RewardModelError, match=r"no model named 'judge' \(it has \['actor'\]\).*judge_model"):
        rm.model_path(args, "judge")
    with pytest.raises(rm.RewardModelError, match=r"'judge' is not served in this run \(served: \['actor'\]\)"):
        rm.router_url(Namespace(sglang_model_routers={"actor": ("127.0.0.1", 1)}), "judge")


def test_qwen_classifier_heads_need_their_bias(tmp_path: Path) -> None:
    head = {"score.weight": torch.zeros(1, 4)}
    bare = checkpoint(tmp_path, "bare", "Qwen3ForSequenceClassification", head)
    with pytest.raises(rm.RewardModelError, match=r"randomly initialised.*add a zero `score.bias`"):
        rm.check_classifier(bare)
    rm.check_classifier(
        checkpoint(tmp_path, "biased", "Qwen2ForSequenceClassification", {**head, "score.bias": torch.zeros(1)})
    )
    rm.check_classifier(checkpoint(tmp_path, "llama", "LlamaForSequenceClassification", head))


def test_the_verdict_prompt_is_a_user_turn_in_the_judges_template(tiny_qwen3: Path) -> None:
    tok = rm.tokenizer_of(str(tiny_qwen3))
    sample = Sample(prompt=[{"role": "user", "content": "What is 2+2?"}], response="4", label="4")
    ids = rm.judge_prompt_ids(Namespace(judge_prompt="Q: {prompt} A: {response} ({label})"), tok, sample)
    assert tok.decode(ids) == "<|im_start|>user\nQ: What is 2+2? A: 4 (4)<|im_end|>\n<|im_start|>assistant\n"
    assert rm.verdict_ids(tok, "Yes") == tok.encode("Yes", add_special_tokens=False)
    with pytest.raises(rm.RewardModelError, match="judge_yes/judge_no"):
        rm.verdict_ids(tok, "")


@pytest.mark.parametrize("name", ["generative_judge", "classifier_reward"])
def test_the_rewards_load_under_their_flag_and_are_documented(name: str) -> None:
    from slime_like.core.plugin_loader import load_hook
    from tests.conftest import REPO_ROOT

    path = f"plugins.reward_models.{name}"
    fn, _ = load_hook(path, "--custom-rm-path", "auto", (2, None), (2, None))
    assert fn is getattr(rm, name)
    assert f"`{path}`" in (REPO_ROOT / "docs" / "plugins.md").read_text()


def test_the_verdict_probability_is_stable() -> None:
    assert rm.verdict_probability(-1.0, -1.0) == 0.5
    assert rm.verdict_probability(-0.1, -2000.0) == 1.0 and rm.verdict_probability(-2000.0, -0.1) == 0.0
    assert rm.verdict_probability(-1.0, -3.0) == pytest.approx(1 / (1 + torch.e**-2))
