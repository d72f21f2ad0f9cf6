"""tools/merge_lora.py: a PEFT adapter merged into its HF base gives the logits of base + adapter in
transformers + peft; the variants a plain merge cannot reproduce are refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tools import merge_lora

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _adapter(base: Path, out: Path, **config) -> Path:
    """A PEFT adapter on `base` with random A and B (so it changes the logits), saved by peft itself."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(init_lora_weights=False, target_modules=ALL, **config))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    peft_model.save_pretrained(out)
    return out


@pytest.mark.parametrize("config", [{"r": 4, "lora_alpha": 8}, {"r": 8, "lora_alpha": 4, "use_rslora": True}])
def test_merged_checkpoint_has_the_logits_of_base_plus_adapter(config, tiny_qwen3, tmp_path, capsys) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter = _adapter(tiny_qwen3, tmp_path / "adapter", **config)
    merge_lora.main(["--hf-checkpoint", str(tiny_qwen3), "--adapter", str(adapter), "--save", str(tmp_path / "out")])
    assert "wrote 1 safetensors file(s)" in capsys.readouterr().out
    tokens = torch.randint(0, 512, (2, 19), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32)
        plain = base(tokens).logits
        expected = PeftModel.from_pretrained(base, str(adapter)).eval()(tokens).logits
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()(tokens).logits
    assert float((expected - plain).abs().max()) > 1e-2  # the adapter matters
    torch.testing.assert_close(merged, expected, atol=1e-5, rtol=0)
    assert (tmp_path / "out" / "tokenizer_config.json").is_file()  # loads as the base does


def test_unmergeable_adapters_are_refused_by_name(tiny_qwen3, tmp_path) -> None:
    adapter = _adapter(tiny_qwen3, tmp_path / "adapter", r=4, lora_alpha=8)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    args = ["--hf-checkpoint", str(tiny_qwen3), "--adapter", str(adapter), "--save", str(tmp_path / "out")]
    with pytest.raises(SystemExit, match=r"DoRA \(use_dora\) is not supported.*merge_and_unload"):
        merge_lora.main(args)
    with pytest.raises(SystemExit, match="adapter_config.json is missing"):
        merge_lora.main([*args[:3], str(tmp_path / "nowhere"), *args[4:]])
