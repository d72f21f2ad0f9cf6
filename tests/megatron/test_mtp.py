"""MTP training (--enable-mtp-training) on a tiny MiMo: the MTP layer loads from and exports back to HF
bit-exactly; a train step's logged MTP loss and the MTP layer's gradient match an independent implementation of
MiMo's MTP head on the HF tensors (transformers' Qwen2 layers); the MTP loss trains the MTP layer only; the policy
loss and gradient are those of a model without MTP layers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from buffer.train_data import TrainData
from slime_like.trainer.megatron import model as model_lib
from slime_like.trainer.megatron import mtp as mtp_lib
from slime_like.trainer.megatron.engine import MegatronTrainEngine
from slime_like.trainer.megatron.optimizer import OptimizerSettings
from tests.megatron.common import torch_dist_to_hf_round_trip
from tests.megatron.test_families import safetensors_of
from tests.megatron.tiny_families import make_mimo

SEQUENCES = [list(range(5, 17)), list(range(300, 309)), [7, 9, 11, 13, 2]]
RESPONSES = [7, 5, 2]  # response lengths; the second response's first two tokens are masked out
FACTOR = 0.5


@pytest.fixture(scope="module")
def tiny_mimo_mtp(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_mimo(tmp_path_factory.mktemp("tiny-mimo-mtp"), tiny_qwen3)


def _batch() -> TrainData:
    masks = [[1] * 7, [0, 0, 1, 1, 1], [1] * 2]
    return TrainData(tokens=SEQUENCES, response_lengths=RESPONSES, loss_masks=masks)


def _engine(hf_dir: Path, mtp: bool, **config_overrides: object) -> MegatronTrainEngine:
    # Plain SGD without clipping: the gradients are what the loss says (clipping would mix MTP and policy norms).
    settings = OptimizerSettings(
        lr=0.1, clip_grad=0.0, optimizer="sgd", sgd_momentum=0.0, use_distributed_optimizer=False
    )
    kwargs = {"mtp_layers": 1, "mtp_loss_scaling_factor": FACTOR} if mtp else {}
    return MegatronTrainEngine(hf_dir, settings, max_tokens_per_micro_batch=24, **kwargs, **config_overrides)


def _policy_loss(logprobs: list[torch.Tensor], micro: TrainData) -> torch.Tensor:
    """Minus the mean log-prob of each response (a stand-in for the policy loss)."""
    masks = micro.masks(logprobs[0].device)
    return sum(-(lp[-len(m) :] * m).sum() / 10 for lp, m in zip(logprobs, masks, strict=True))


def _main_grads(engine: MegatronTrainEngine) -> dict[str, torch.Tensor]:
    return {n: p.main_grad.clone() for n, p in engine.model[0].named_parameters() if ".mtp." not in n}


def _reference_mtp(hf_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """MiMo's MTP head (its modeling: input_proj(cat[hidden_layernorm(h), token_layernorm(embedding)]), a Qwen2
    decoder layer, final_layernorm, the LM head) on the HF tensors: the mean cross-entropy of the next-next token
    over the loss tokens, and the gradient of FACTOR x that loss for input_proj (HF layout)."""
    import transformers
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    tensors = safetensors_of(hf_dir)
    config = transformers.Qwen2Config.from_pretrained(hf_dir)
    main = transformers.Qwen2ForCausalLM.from_pretrained(hf_dir, config=config, dtype=torch.float32).eval()
    head_config = transformers.Qwen2Config(**{**config.to_dict(), "num_hidden_layers": 1, "layer_types": None})
    head = transformers.Qwen2ForCausalLM(head_config).eval()
    prefix = "model.mtp_layers.0."
    state = {f"model.layers.0.{n[len(prefix) :]}": t for n, t in tensors.items() if n.startswith(prefix)}
    state.update({"model.norm.weight": tensors[f"{prefix}final_layernorm.weight"]})
    state.update({k: tensors[k] for k in ("model.embed_tokens.weight", "lm_head.weight")})
    head.load_state_dict(state, strict=False)
    norms = []
    for name in ("hidden_layernorm", "token_layernorm"):
        norm = Qwen2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        norm.weight.data.copy_(tensors[f"{prefix}{name}.weight"])
        norms.append(norm)
    input_proj = torch.nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
    input_proj.weight.data.copy_(tensors[f"{prefix}input_proj.weight"])
    total, count = torch.zeros(()), 0.0
    for tokens, response_mask in zip(SEQUENCES, _batch().masks(), strict=True):
        x = torch.tensor(tokens)[None]
        mask = torch.cat([torch.zeros(len(tokens) - 1 - len(response_mask)), response_mask])
        with torch.no_grad():
            hidden = main.model(x).last_hidden_state[:, :-1]  # position j, j < L - 1
            embedded = main.model.embed_tokens(x[:, 1:])  # token j + 1
        inputs = input_proj(torch.cat([norms[0](hidden), norms[1](embedded)], dim=-1))
        logits = head(inputs_embeds=inputs, position_ids=torch.arange(len(tokens) - 1)[None]).logits[0, :-1]
        ce = -torch.log_softmax(logits, dim=-1).gather(-1, x[0, 2:, None])[:, 0]  # token j + 2 from position j
        total = total + (ce * mask[1:]).sum()
        count += float(mask[1:].sum())
    loss = total / count
    (FACTOR * loss).backward()
    return loss.detach(), input_proj.weight.grad


def test_mtp_layer_loads_and_exports_bit_exactly(tiny_mimo_mtp: Path, megatron_world) -> None:
    from slime_like.trainer.megatron.model import untrained_hf_weights

    engine = _engine(tiny_mimo_mtp, mtp=True)
    exported = dict(engine.export_hf_weights())
    expected = safetensors_of(tiny_mimo_mtp)
    assert sorted(exported) == sorted(expected)  # the MTP layer is the model's now, every tensor included
    assert not dict(untrained_hf_weights(engine.bridge))
    for name, tensor in exported.items():
        assert tensor.dtype == expected[name].dtype and torch.equal(tensor, expected[name]), name


def test_mtp_loss_and_gradient_match_mimo_formula(tiny_mimo_mtp: Path, megatron_world) -> None:
    reference_loss, reference_grad = _reference_mtp(tiny_mimo_mtp)
    plain, engine = _engine(tiny_mimo_mtp, mtp=False), _engine(tiny_mimo_mtp, mtp=True)
    before = dict((n, t.clone()) for n, t in engine.export_hf_weights())
    batch = _batch()
    masks = engine.mtp.loss_masks(batch)
    out = engine.train_step(SEQUENCES, batch, _policy_loss, mtp_loss_masks=masks)
    baseline = plain.train_step(SEQUENCES, batch, _policy_loss)
    # Logged as slime logs it: per layer and summed, unscaled.
    assert out["mtp_1_loss"] == pytest.approx(float(reference_loss), rel=1e-5)
    assert out["mtp_loss"] == out["mtp_1_loss"]
    # The policy loss, and the gradient of every main parameter, are those of the model without MTP layers.
    assert out["loss"] == pytest.approx(baseline["loss"], rel=1e-6)
    with_mtp, without = _main_grads(engine), _main_grads(plain)
    assert sorted(with_mtp) == sorted(without)
    for name, grad in with_mtp.items():
        torch.testing.assert_close(grad, without[name], rtol=1e-5, atol=1e-7, msg=name)
    # The MTP layer's gradient is FACTOR / mtp_num_layers x d(MTP loss): Megatron's eh_proj is MiMo's input_proj
    # with the [hidden, embedding] halves swapped.
    eh_proj = engine.model[0].module.mtp.layers[0].eh_proj.weight.main_grad
    torch.testing.assert_close(torch.cat(eh_proj.chunk(2, dim=1)[::-1], dim=1), reference_grad, rtol=1e-4, atol=1e-7)
    after = dict(engine.export_hf_weights())
    changed = {n for n in after if not torch.equal(after[n], before[n])}
    assert {n for n in changed if n.startswith("model.mtp_layers.0.")} == {n for n in after if "mtp_layers" in n}


def test_mtp_loss_trains_only_the_mtp_layer(tiny_mimo_mtp: Path, megatron_world) -> None:
    engine = _engine(tiny_mimo_mtp, mtp=True)
    before = dict((n, t.clone()) for n, t in engine.export_hf_weights())
    batch = _batch()

    def no_policy_loss(logprobs: list[torch.Tensor], data: list[dict]) -> torch.Tensor:
        return sum(lp.sum() * 0.0 for lp in logprobs)

    out = engine.train_step(SEQUENCES, batch, no_policy_loss, mtp_loss_masks=engine.mtp.loss_masks(batch))
    assert out["loss"] == 0.0 and out["mtp_loss"] > 0
    changed = {n for n, t in engine.export_hf_weights() if not torch.equal(t, before[n])}
    assert changed and all(n.startswith("model.mtp_layers.0.") for n in changed)
    with pytest.raises(ValueError, match="pass mtp_loss_masks"):
        engine.train_step(SEQUENCES, batch, no_policy_loss)


def test_mtp_refused_where_it_cannot_be_built(tiny_qwen3: Path, tiny_mimo_mtp: Path, megatron_world) -> None:
    with pytest.raises(
        ValueError, match="trained for mimo, deepseek_v3, kimi_k2, glm4_moe_lite, glm4_moe only, not model_type 'qwen3'"
    ):
        MegatronTrainEngine(tiny_qwen3, None, mtp_layers=1)
    with pytest.raises(ValueError, match="--mtp-num-layers 2: the checkpoint has 1 MTP layer"):
        MegatronTrainEngine(tiny_mimo_mtp, None, mtp_layers=2)
    from megatron.core import parallel_state as mpu

    with pytest.MonkeyPatch.context() as patch:  # a virtual pipeline, as init_parallel(vpp=2) would set it
        patch.setattr(mpu, "get_virtual_pipeline_model_parallel_world_size", lambda: 2)
        with pytest.raises(ValueError, match="--enable-mtp-training with a virtual pipeline"):
            mtp_lib.enable_mtp(model_lib.make_bridge(tiny_mimo_mtp), 1, 0.2)


def test_trained_mtp_layer_survives_torch_dist_to_hf(tiny_mimo_mtp: Path, tmp_path: Path, megatron_world) -> None:
    engine = _engine(tiny_mimo_mtp, mtp=True)
    batch = _batch()
    engine.train_step(SEQUENCES, batch, _policy_loss, mtp_loss_masks=engine.mtp.loss_masks(batch))
    # The trained MTP layer, not the original's.
    converted, original = torch_dist_to_hf_round_trip(engine, tiny_mimo_mtp, tmp_path), safetensors_of(tiny_mimo_mtp)
    assert not torch.equal(
        converted["model.mtp_layers.0.input_proj.weight"], original["model.mtp_layers.0.input_proj.weight"]
    )


def check_parallel_steps(hf_dir: Path, tmp_path: Path, layouts: str, convert: bool = False) -> None:
    """The MTP step at each of tests/megatron/mtp_worker.py's layouts is the single-process step: the same log-probs
    before it (1e-5), the same export before it (bit-exact), the same logged losses (rel 1e-5) and the same weights
    after it, the MTP layer's included; at PP 2 only the last stage holds the MTP block, and its copy of the word
    embedding stays the first stage's; convert: PP 2's torch_dist checkpoint converts to HF as the step's weights."""
    from tests.megatron.launch import torchrun
    from tools.convert_torch_dist_to_hf import main as torch_dist_to_hf

    engine = _engine(hf_dir, mtp=True)
    initial = {n: t.clone() for n, t in engine.export_hf_weights()}
    logprobs = engine.forward_logprobs(SEQUENCES)
    batch = _batch()
    expected = engine.train_step(SEQUENCES, batch, _policy_loss, mtp_loss_masks=engine.mtp.loss_masks(batch))
    weights = {n: t.clone() for n, t in engine.export_hf_weights()}
    torchrun(Path(__file__).with_name("mtp_worker.py"), [str(tmp_path / "out.pt"), str(hf_dir), layouts])
    results = torch.load(tmp_path / "out.pt")
    assert sorted(results) == sorted(layouts.split(","))
    for layout, (metrics, exported, layout_logprobs, layout_initial, holds_mtp, embeddings) in results.items():
        assert holds_mtp == ([False, True] if layout == "pp2" else [True, True]), layout
        if layout == "pp2":  # the MTP stage's copy of the embedding moved with the first stage's
            assert torch.equal(embeddings[0], embeddings[1])
            if convert:  # its torch_dist checkpoint converts back to the step's weights, the MTP layer's included
                torch_dist_to_hf(["--load", str(tmp_path / "pp2-ckpt"), "--hf-checkpoint", str(hf_dir), "--save",
                                  str(tmp_path / "pp2-hf")])  # fmt: skip
                converted = safetensors_of(tmp_path / "pp2-hf")
                assert sorted(converted) == sorted(exported)
                assert all(torch.equal(t, exported[n]) for n, t in converted.items())
        for got, want in zip(layout_logprobs, logprobs, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5, msg=f"{layout} log-probs")
        assert sorted(layout_initial) == sorted(initial)
        assert all(torch.equal(layout_initial[n], t) for n, t in initial.items()), layout
        for key in ("loss", "mtp_loss", "mtp_1_loss"):
            assert metrics[key] == pytest.approx(expected[key], rel=1e-5), (layout, key)
        assert sorted(exported) == sorted(weights)
        for name, tensor in exported.items():
            torch.testing.assert_close(tensor, weights[name], rtol=1e-5, atol=1e-6, msg=f"{layout} {name}")


def test_mtp_step_is_the_same_at_tp2_dp2_and_pp2(tiny_mimo_mtp: Path, tmp_path: Path, megatron_world) -> None:
    """TP 2 (vocab-parallel MTP logits, column-parallel eh_proj), DP 2 with each rank holding its share (the MTP
    token count summed over DP) and PP 2 (the MTP block, and a copy of the embedding, on the last stage) take the
    single-process step; PP 2's torch_dist checkpoint converts to HF with the trained MTP layer."""
    check_parallel_steps(tiny_mimo_mtp, tmp_path, "tp2,dp2,pp2", convert=True)


def test_mtp_names_under_transformer_engine() -> None:
    from slime_like.trainer.megatron.families import template

    name = "mtp.layers.0.transformer_layer.self_attention.linear_qkv.layer_norm_weight"
    assert template(name) == ("mtp.layers.{layer}.transformer_layer.input_layernorm.weight", 0, None)
    assert template("mtp.layers.1.eh_proj.weight") == ("mtp.layers.{layer}.eh_proj.weight", 1, None)


def test_trainer_rank_logs_mtp_losses_as_slime(
    tiny_mimo_mtp: Path, megatron_world, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from slime_like.trainer.actor import TrainActor
    from tests.megatron.algo_common import actor_args, make_data

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, os.environ.get(key, "0"))  # TrainActor sets them; restored after the test
    flags = ["--enable-mtp-training", "--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "0.3"]
    actor = TrainActor(actor_args(tiny_mimo_mtp, flags), 0, "127.0.0.1", 0)
    assert actor.engine.mtp is not None and actor.engine.mtp.scale == pytest.approx(0.3)
    before = {n: t.clone() for n, t in actor.engine.export_hf_weights() if "mtp_layers" in n}
    metrics = actor.train(0, make_data())
    assert metrics["train/mtp_loss"] == metrics["train/mtp_1_loss"] > 0
    after = dict(actor.engine.export_hf_weights())
    assert all(not torch.equal(after[n], t) for n, t in before.items() if not n.endswith("layernorm.weight"))


def test_mtp_loss_follows_the_cp2_split(tmp_path: Path, megatron_world) -> None:
    """CP 2 (tests/megatron/mtp_cp_worker.py: megatron-core's MTP block, two layers deep, without attention, which
    the CPU cannot run under CP) gives one process's MTP losses and MTP-block gradients: the token ids roll across
    the ranks' zig-zag chunks and each rank's targets are the full sequence's at its positions."""
    from tests.megatron.launch import torchrun
    from tests.megatron.mtp_cp_worker import run_step

    logged, grads = run_step(1, 0)
    assert logged["mtp_loss"] == pytest.approx(logged["mtp_1_loss"] + logged["mtp_2_loss"], rel=1e-6)
    assert {n.split(".")[0] for n in grads} == {"mtp"}  # the loss trains the MTP block only
    torchrun(Path(__file__).with_name("mtp_cp_worker.py"), [str(tmp_path)])
    for rank in range(2):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        for key, value in logged.items():
            assert result["logged"][key] == pytest.approx(value, rel=1e-5), (rank, key)
        assert sorted(result["grads"]) == sorted(grads)
        for name, grad in grads.items():
            torch.testing.assert_close(result["grads"][name], grad, rtol=1e-5, atol=1e-7, msg=f"rank {rank} {name}")
