"""The LoRA transport's medium (shared memory when every server runs on this machine, disk otherwise) and the layout
it sends through shared memory."""

from __future__ import annotations

import pytest
import torch

from slime_like.trainer.megatron.lora import LoraSettings
from slime_like.trainer.weights.lora import LoraTransport, MultiLoraTransport, flatten_stacked, on_this_machine, stacked

SETTINGS = LoraSettings(4, 8.0, targets=("linear_qkv",))
REMOTE = "http://192.0.2.7:30000"  # TEST-NET-1 (RFC 5737): never an address of this machine


def test_local_servers_load_from_shared_memory_and_remote_ones_from_disk(tmp_path) -> None:
    assert on_this_machine("http://127.0.0.1:30000") and on_this_machine("http://localhost:1")
    assert not on_this_machine(REMOTE)
    local = LoraTransport(["http://127.0.0.1:30000", "http://127.0.0.1:30001"], SETTINGS, "base", tmp_path)
    assert local.medium == "tensor"
    assert LoraTransport(["http://127.0.0.1:30000", REMOTE], SETTINGS, "base", tmp_path).medium == "disk"
    assert MultiLoraTransport([REMOTE], SETTINGS, "base", tmp_path, medium="tensor").medium == "tensor"  # forced
    with pytest.raises(ValueError, match="choose one of auto, tensor, disk"):
        LoraTransport([REMOTE], SETTINGS, "base", tmp_path, medium="nccl")


def _peft(prefix: str, modules: tuple[str, ...], a: torch.Tensor, rows: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """PEFT keys of one fused Megatron layer's export: one A repeated for each module, each with its B rows."""
    out = {}
    for module, n in zip(modules, rows, strict=True):
        out[f"{prefix}.{module}.lora_A.weight"] = a
        out[f"{prefix}.{module}.lora_B.weight"] = torch.randn(n, a.shape[0])
    return out


def test_fused_groups_go_stacked_as_sglang_stacks_them() -> None:
    """q/k/v (gate/up) sharing one A go as SGLang's qkv_proj (gate_up_proj): A once, the B's end to end, i.e. what
    SGLang's loader makes of the PEFT keys (it repeats a stacked A, and concatenates separate ones); anything else
    goes as it is. The flat buffer holds exactly those tensors."""
    torch.manual_seed(0)
    attn, mlp = "base_model.model.model.layers.0.self_attn", "base_model.model.model.layers.0.mlp"
    tensors = {
        **_peft(attn, ("q_proj", "k_proj", "v_proj"), torch.randn(4, 8), (8, 4, 4)),
        **_peft(attn, ("o_proj",), torch.randn(4, 8), (8,)),
        **_peft(mlp, ("gate_proj", "up_proj"), torch.randn(4, 8), (12, 12)),
        **_peft(mlp, ("down_proj",), torch.randn(4, 12), (8,)),
    }
    entries = stacked(tensors)
    names = [name for name, _ in entries]
    assert names == [f"{attn}.qkv_proj.lora_A.weight", f"{attn}.qkv_proj.lora_B.weight",
                     f"{attn}.o_proj.lora_A.weight", f"{attn}.o_proj.lora_B.weight",
                     f"{mlp}.gate_up_proj.lora_A.weight", f"{mlp}.gate_up_proj.lora_B.weight",
                     f"{mlp}.down_proj.lora_A.weight", f"{mlp}.down_proj.lora_B.weight"]  # fmt: skip
    buffer = torch.empty(1 << 16, dtype=torch.uint8)
    flat, metadata = flatten_stacked(entries, buffer)
    got = {m["name"]: flat[m["start_idx"] : m["end_idx"]].view(m["dtype"]).view(m["shape"]) for m in metadata}
    assert all(m["start_idx"] % 64 == 0 for m in metadata)
    qkv = [tensors[f"{attn}.{m}.lora_B.weight"] for m in ("q_proj", "k_proj", "v_proj")]
    assert torch.equal(got[f"{attn}.qkv_proj.lora_B.weight"], torch.cat(qkv))
    assert torch.equal(got[f"{attn}.qkv_proj.lora_A.weight"], tensors[f"{attn}.q_proj.lora_A.weight"])
    assert torch.equal(got[f"{mlp}.down_proj.lora_B.weight"], tensors[f"{mlp}.down_proj.lora_B.weight"])
    # Separate A's (not one Megatron layer's) and an incomplete group stay PEFT-keyed.
    apart = {**tensors, f"{attn}.k_proj.lora_A.weight": torch.randn(4, 8)}
    assert [n for n, _ in stacked(apart)][:6] == [f"{attn}.{m}.lora_{x}.weight" for m in ("q_proj", "k_proj", "v_proj")
                                                  for x in "AB"]  # fmt: skip
    partial = {k: v for k, v in tensors.items() if ".up_proj." not in k}
    assert f"{mlp}.gate_proj.lora_A.weight" in dict(stacked(partial))
    equal_copies = {**tensors, f"{attn}.v_proj.lora_A.weight": tensors[f"{attn}.q_proj.lora_A.weight"].clone()}
    assert f"{attn}.qkv_proj.lora_B.weight" in dict(stacked(equal_copies))  # equal values, not the same tensor
