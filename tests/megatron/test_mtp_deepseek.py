"""MTP training (--enable-mtp-training) on the DeepSeek layout, on a tiny GLM-4.7-Flash (glm4_moe_lite: MLA, MoE with
a shared expert and expert bias, the MTP layer at model.layers.{num_hidden_layers}): the MTP layer (MLA + MoE, the
local spec) loads from and exports back to HF bit-exactly, also through torch_dist; a train step's MTP loss and the
MTP layer's gradients match an independent implementation of DeepSeek-V3's MTP module (transformers' GLM-4.7-Flash
decoder layer on the HF tensors); the policy loss, gradients and updated main weights are those of a model without
MTP layers; under routing replay the MTP layer routes itself."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from slime_like.trainer.megatron.engine import MegatronTrainEngine
from tests.megatron.common import torch_dist_to_hf_round_trip
from tests.megatron.test_families import safetensors_of
from tests.megatron.test_mtp import (
    FACTOR,
    SEQUENCES,
    _batch,
    _engine,
    _main_grads,
    _policy_loss,
    check_parallel_steps,
)
from tests.megatron.tiny_families import _add_mtp_layer, make_deepseek_v3, make_glm4_moe, make_glm4_moe_lite

MTP = "model.layers.3."  # the tiny model's 3 main layers are followed by its MTP layer


@pytest.fixture(scope="module")
def tiny_glm_mtp(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_glm4_moe_lite(tmp_path_factory.mktemp("tiny-glm4-moe-lite-mtp"), tiny_qwen3)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _reference_mtp(hf_dir: Path) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DeepSeek-V3's MTP module (arXiv:2412.19437 section 2.2; SGLang's deepseek_nextn) on the HF tensors:
    h' = eh_proj(cat[enorm(embedding of token j+1), hnorm(main hidden state at j)]), GLM-4.7-Flash's decoder layer
    (an MoE layer), shared_head.norm, the LM head. Returns the mean cross-entropy of token j+2 over the loss tokens
    and the gradients of FACTOR x that loss for eh_proj and the MTP layer's q_a_proj (HF layouts)."""
    import transformers

    tensors = safetensors_of(hf_dir)
    config = transformers.AutoConfig.from_pretrained(hf_dir)
    main = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    # The MTP layer as the only layer of a model whose norm is shared_head.norm; it is MoE, as SGLang builds it.
    layer_config = type(config)(
        **{**config.to_dict(), "num_hidden_layers": 1, "mlp_layer_types": ["sparse"], "first_k_dense_replace": 0}
    )
    own = ("enorm.", "hnorm.", "eh_proj.", "shared_head.")
    state = {
        f"model.layers.0.{n[len(MTP) :]}": t
        for n, t in tensors.items()
        if n.startswith(MTP) and not n[len(MTP) :].startswith(own)
    }
    state["model.norm.weight"] = tensors[f"{MTP}shared_head.norm.weight"]
    state.update({k: tensors[k] for k in ("model.embed_tokens.weight", "lm_head.weight")})
    with tempfile.TemporaryDirectory() as layer_dir:  # from_pretrained fuses the stored per-expert tensors
        layer_config.save_pretrained(layer_dir)
        save_file(state, f"{layer_dir}/model.safetensors", metadata={"format": "pt"})
        head = transformers.AutoModelForCausalLM.from_pretrained(layer_dir, dtype=torch.float32).eval()
    loaded = {n: t for n, t in head.state_dict().items() if not n.startswith("model.layers.0.mlp.experts.")}
    for name, tensor in loaded.items():
        assert torch.equal(tensor, state[name]), name
    eh_proj = torch.nn.Parameter(tensors[f"{MTP}eh_proj.weight"].clone())
    eps = config.rms_norm_eps
    total, count = torch.zeros(()), 0.0
    for tokens, response_mask in zip(SEQUENCES, _batch().masks(), strict=True):
        x = torch.tensor(tokens)[None]
        mask = torch.cat([torch.zeros(len(tokens) - 1 - len(response_mask)), response_mask])
        with torch.no_grad():
            hidden = main.model(x).last_hidden_state[:, :-1]  # position j, j < L - 1 (after the final norm)
            embedded = main.model.embed_tokens(x[:, 1:])  # token j + 1
        joined = torch.cat(
            [
                _rms_norm(embedded, tensors[f"{MTP}enorm.weight"], eps),
                _rms_norm(hidden, tensors[f"{MTP}hnorm.weight"], eps),
            ],
            dim=-1,
        )
        inputs = joined @ eh_proj.T
        logits = head(inputs_embeds=inputs, position_ids=torch.arange(len(tokens) - 1)[None]).logits[0, :-1]
        ce = -torch.log_softmax(logits, dim=-1).gather(-1, x[0, 2:, None])[:, 0]  # token j + 2 from position j
        total = total + (ce * mask[1:]).sum()
        count += float(mask[1:].sum())
    loss = total / count
    (FACTOR * loss).backward()
    q_a_proj = head.model.layers[0].self_attn.q_a_proj.weight
    return loss.detach(), {"eh_proj": eh_proj.grad, "q_a_proj": q_a_proj.grad}


@pytest.mark.parametrize(
    ("family", "attention", "mtp"),
    [
        ("glm4_moe_lite", "MLASelfAttention", MTP),
        ("glm4_moe", "SelfAttention", "model.layers.4."),  # GLM-4.5 / GLM-4.7-355B: GQA
        ("deepseek_v3", "MLASelfAttention", MTP),  # group-limited routing; Kimi-K2 takes the same bridge
    ],
)
def test_mtp_layer_loads_and_exports_bit_exactly(
    family: str, attention: str, mtp: str, tiny_glm_mtp: Path, tiny_qwen3: Path, tmp_path: Path, megatron_world
) -> None:
    from slime_like.trainer.megatron.model import untrained_hf_weights

    if family == "glm4_moe_lite":
        hf_dir = tiny_glm_mtp
    elif family == "glm4_moe":
        hf_dir = make_glm4_moe(tmp_path / family, tiny_qwen3)
    else:  # DeepSeek-V3's 4th layer becomes its MTP layer
        hf_dir = make_deepseek_v3(tmp_path / family, tiny_qwen3)
        _add_mtp_layer(hf_dir, {})
    engine = _engine(hf_dir, mtp=True)
    layer = engine.model[0].module.mtp.layers[0].transformer_layer
    assert type(layer.self_attention).__name__ == attention and type(layer.mlp).__name__ == "MoELayer"
    exported = dict(engine.export_hf_weights())
    expected = safetensors_of(hf_dir)
    assert sorted(exported) == sorted(expected)  # the MTP layer is the model's now, every tensor included
    assert any(n.startswith(f"{mtp}mlp.experts.") for n in exported) and f"{mtp}eh_proj.weight" in exported
    assert not dict(untrained_hf_weights(engine.bridge))
    for name, tensor in exported.items():
        assert tensor.dtype == expected[name].dtype and torch.equal(tensor, expected[name]), name


def test_mtp_loss_and_gradient_match_deepseek_formula(tiny_glm_mtp: Path, megatron_world) -> None:
    reference_loss, reference_grads = _reference_mtp(tiny_glm_mtp)
    plain, engine = _engine(tiny_glm_mtp, mtp=False), _engine(tiny_glm_mtp, mtp=True)
    before = {n: t.clone() for n, t in engine.export_hf_weights()}
    batch = _batch()
    out = engine.train_step(SEQUENCES, batch, _policy_loss, mtp_loss_masks=engine.mtp.loss_masks(batch))
    baseline = plain.train_step(SEQUENCES, batch, _policy_loss)
    assert out["mtp_1_loss"] == pytest.approx(float(reference_loss), rel=1e-5)
    assert out["mtp_loss"] == out["mtp_1_loss"]
    # The policy loss, every main parameter's gradient and every main weight after the step (expert biases
    # included) are those of the model without MTP layers.
    assert out["loss"] == pytest.approx(baseline["loss"], rel=1e-6)
    with_mtp, without = _main_grads(engine), _main_grads(plain)
    assert sorted(with_mtp) == sorted(without)
    for name, grad in with_mtp.items():
        torch.testing.assert_close(grad, without[name], rtol=1e-5, atol=1e-7, msg=name)
    after, after_plain = dict(engine.export_hf_weights()), dict(plain.export_hf_weights())
    for name, tensor in after_plain.items():
        torch.testing.assert_close(after[name], tensor, rtol=1e-6, atol=1e-7, msg=name)
    # The MTP layer's gradients are FACTOR / mtp_num_layers x d(MTP loss) (Megatron's eh_proj is DeepSeek's).
    layer = engine.model[0].module.mtp.layers[0]
    torch.testing.assert_close(layer.eh_proj.weight.main_grad, reference_grads["eh_proj"], rtol=1e-4, atol=1e-7)
    q_down = layer.transformer_layer.self_attention.linear_q_down_proj.weight.main_grad
    torch.testing.assert_close(q_down, reference_grads["q_a_proj"], rtol=1e-4, atol=1e-7)
    changed = {n for n in after if n.startswith(MTP) and not torch.equal(after[n], before[n])}
    assert {f"{MTP}eh_proj.weight", f"{MTP}self_attn.q_a_proj.weight", f"{MTP}mlp.gate.weight"} <= changed


def test_mtp_layer_routes_itself_under_routing_replay(tiny_glm_mtp: Path, megatron_world) -> None:
    """Replaying the main layers' own routing (what SGLang returns: main layers only) takes the step of a free run;
    the MTP layer's router is not among the replaying ones."""
    from slime_like.trainer.megatron.optimizer import OptimizerSettings

    free = _engine(tiny_glm_mtp, mtp=True)
    replaying = MegatronTrainEngine(
        tiny_glm_mtp,
        OptimizerSettings(lr=0.1, clip_grad=0.0, optimizer="sgd", sgd_momentum=0.0, use_distributed_optimizer=False),
        max_tokens_per_micro_batch=24,
        mtp_layers=1,
        mtp_loss_scaling_factor=FACTOR,
        moe_enable_routing_replay=True,
    )
    routers = replaying.routers[id(replaying.model[0])]
    assert len(routers) == 2 and all(r.layer_number <= 3 for r in routers)  # the 2 MoE main layers, not the MTP's
    assert replaying.model[0].module.mtp.layers[0].transformer_layer.mlp.router.router_replay is None
    _, routing = replaying.forward_logprobs_and_routing(SEQUENCES)
    assert [tuple(r.shape) for r in routing] == [(len(s) - 1, 3, 2) for s in SEQUENCES]
    batch = _batch()
    masks = free.mtp.loss_masks(batch)
    expected = free.train_step(SEQUENCES, batch, _policy_loss, mtp_loss_masks=masks)
    out = replaying.train_step(SEQUENCES, batch, _policy_loss, routing=routing, mtp_loss_masks=masks)
    for key in ("loss", "mtp_loss"):
        assert out[key] == pytest.approx(expected[key], rel=1e-6), key


def test_mtp_refused_where_it_cannot_be_built(tiny_glm_mtp: Path, tmp_path: Path, megatron_world) -> None:
    import json
    import shutil

    with pytest.raises(ValueError, match="--mtp-num-layers 2: the checkpoint has 1 MTP layer"):
        MegatronTrainEngine(tiny_glm_mtp, None, mtp_layers=2)
    # A last decoder layer that is dense cannot give the MoE MTP layer its spec.
    dense_last = tmp_path / "dense-last"
    shutil.copytree(tiny_glm_mtp, dense_last)
    config = json.loads((dense_last / "config.json").read_text())
    config["mlp_layer_types"] = ["dense", "sparse", "dense"]
    config.pop("first_k_dense_replace")
    (dense_last / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="its last decoder layer is dense"):
        MegatronTrainEngine(dense_last, None, mtp_layers=1)
    # A config that declares its MTP layer over safetensors without it (as transformers' save_pretrained writes).
    no_tensors = tmp_path / "no-mtp-tensors"
    shutil.copytree(tiny_glm_mtp, no_tensors, ignore=shutil.ignore_patterns("*.safetensors*"))
    kept = {name: t for name, t in safetensors_of(tiny_glm_mtp).items() if not name.startswith(MTP)}
    save_file(kept, no_tensors / "model.safetensors")
    with pytest.raises(ValueError, match=r"declares 1 MTP layer\(s\) but its safetensors hold none"):
        MegatronTrainEngine(no_tensors, None, mtp_layers=1)


def test_trained_mtp_layer_survives_torch_dist_to_hf(tiny_glm_mtp: Path, tmp_path: Path, megatron_world) -> None:
    """The trained MTP layer goes through a torch_dist checkpoint; HF -> torch_dist (--mtp-num-layers 1) -> HF is
    bit-exact."""
    from tools.convert_hf_to_torch_dist import main as hf_to_torch_dist
    from tools.convert_torch_dist_to_hf import main as torch_dist_to_hf

    engine = _engine(tiny_glm_mtp, mtp=True)
    batch = _batch()
    engine.train_step(SEQUENCES, batch, _policy_loss, mtp_loss_masks=engine.mtp.loss_masks(batch))
    # The trained MTP layer, not the original's.
    converted, original = torch_dist_to_hf_round_trip(engine, tiny_glm_mtp, tmp_path), safetensors_of(tiny_glm_mtp)
    assert not torch.equal(converted[f"{MTP}eh_proj.weight"], original[f"{MTP}eh_proj.weight"])
    hf_to_torch_dist(["--hf-checkpoint", str(tiny_glm_mtp), "--save", str(tmp_path / "td"), "--mtp-num-layers", "1"])
    torch_dist_to_hf(
        ["--load", str(tmp_path / "td"), "--hf-checkpoint", str(tiny_glm_mtp), "--save", str(tmp_path / "back")]
    )
    back = safetensors_of(tmp_path / "back")
    assert sorted(back) == sorted(original)
    for name, tensor in original.items():
        assert torch.equal(back[name], tensor), name


def test_mtp_step_is_the_same_at_ep2_dp2_and_pp2(tiny_glm_mtp: Path, tmp_path: Path, megatron_world) -> None:
    """EP 2 (the MTP layer's experts split too), DP 2 with each rank holding its share (the MTP token count summed
    over DP) and PP 2 split as slime's GLM-4.7-Flash script splits it (--decoder-last-pipeline-num-layers: the MTP
    layer on the last stage) take the single-process step (test_mtp.check_parallel_steps).
    TP 2 is not run: megatron-core refuses MoE with TP but without sequence parallel, which the CPU cannot run."""
    check_parallel_steps(tiny_glm_mtp, tmp_path, "ep2,dp2,pp2")
