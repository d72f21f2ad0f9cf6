"""Qwen2.5-VL on the trainer: Megatron's language model beside transformers' vision tower (vision_language.py).

A tiny random Qwen2.5-VL (fp32, written here with transformers: untied, random norms) against
Qwen2_5_VLForConditionalGeneration: log-probs of two sequences with different images packed in one micro-batch within
1e-5 (one masked row, and THD); the 3-D rope positions equal get_rope_index's; a train step reaches the vision tower
unless --freeze-params-name-list freezes it; export, HF -> torch_dist -> HF and the conversion tools are bit-exact.
Qwen3-VL (deepstack) and Qwen3.5 (dense, MoE) against transformers too; their TP / DP / EP runs: test_vlm_parallel.py.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from buffer.train_data import TrainData
from tests.megatron.common import torch_dist_to_hf_round_trip
from tests.megatron.test_families import safetensors_of

IMAGE, VIDEO, START, END = 250, 251, 252, 253  # special token ids of the tiny config
PATCH, TEMPORAL, MERGE = 14, 2, 2


def make_random_qwen2_5_vl(out: Path) -> Path:
    """A random fp32 Qwen2.5-VL checkpoint (two LM layers, two vision blocks, a windowed and a full one)."""
    import transformers

    config = transformers.Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            tie_word_embeddings=False,
        ),
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            patch_size=PATCH,
            temporal_patch_size=TEMPORAL,
            spatial_merge_size=MERGE,
            window_size=56,
            fullatt_block_indexes=[1],
        ),
        image_token_id=IMAGE,
        video_token_id=VIDEO,
        vision_start_token_id=START,
        vision_end_token_id=END,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).to(torch.float32)
    with torch.no_grad():  # random norms, so that a wrong norm mapping shows
        for name, param in model.named_parameters():
            if "norm" in name or "ln_q" in name:
                param.uniform_(0.5, 1.5)
    model.save_pretrained(out)
    return out


def image_sample(grid: tuple[int, int], text: list[int], answer: list[int], seed: int) -> tuple[list[int], dict]:
    """Tokens (text, an image's pads between start/end, text, answer) and its processor-like tensors."""
    g = torch.Generator().manual_seed(seed)
    h, w = grid
    pads = (h // MERGE) * (w // MERGE)
    tokens = [1, 2, START, *[IMAGE] * pads, END, *text, *answer]
    pixels = torch.randn(h * w, 3 * TEMPORAL * PATCH * PATCH, generator=g)
    return tokens, {"pixel_values": pixels, "image_grid_thw": torch.tensor([[1, h, w]])}


SAMPLES = [
    image_sample((4, 4), [5, 6, 7], [8, 9, 10, 11], seed=1),
    image_sample((6, 4), [12, 13], [14, 15, 16], seed=2),
]


@pytest.fixture(scope="module")
def random_qwen2_5_vl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_random_qwen2_5_vl(tmp_path_factory.mktemp("tiny-qwen2_5_vl"))


def vlm_samples(hf_dir: str | Path) -> list[tuple[list[int], dict]]:
    """SAMPLES with pixels of the checkpoint's patch size (Qwen3.5's tower takes 16 x 16 patches: fresh pixels)."""
    import json

    vision = json.loads((Path(hf_dir) / "config.json").read_text())["vision_config"]
    patch = vision.get("patch_size", 16) ** 2 * vision.get("temporal_patch_size", 2) * 3
    if patch == SAMPLES[0][1]["pixel_values"].shape[1]:
        return SAMPLES
    samples = []
    for (tokens, images), seed in zip(SAMPLES, (3, 4), strict=True):
        pixels = torch.randn(images["pixel_values"].shape[0], patch, generator=torch.Generator().manual_seed(seed))
        samples.append((tokens, {"pixel_values": pixels, "image_grid_thw": images["image_grid_thw"]}))
    return samples


def hf_logprobs(hf_dir: str | Path) -> list[torch.Tensor]:
    """transformers' log-probs of tokens 1..L-1 of each of vlm_samples, one forward each (the independent reference)."""
    import transformers

    model = transformers.AutoModelForImageTextToText.from_pretrained(hf_dir, dtype=torch.float32).eval()
    out = []
    for tokens, images in vlm_samples(hf_dir):
        ids = torch.tensor([tokens])
        kinds = (ids == IMAGE).int()  # mm_token_type_ids: image 1, text 0
        with torch.no_grad():
            logits = model(input_ids=ids, mm_token_type_ids=kinds, **images).logits[0]
        out.append(torch.log_softmax(logits, -1)[:-1].gather(-1, ids[0, 1:, None])[:, 0])
    return out


def make_random_qwen3_vl(out: Path) -> Path:
    """A random fp32 Qwen3-VL checkpoint (three LM layers, the tower's deepstack features entering the first two)."""
    import transformers

    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2], "mrope_interleaved": True}
    config = transformers.Qwen3VLConfig(
        text_config=dict(
            vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, rope_parameters=rope,
        ),
        vision_config=dict(
            depth=3, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=PATCH,
            temporal_patch_size=TEMPORAL, spatial_merge_size=MERGE, num_position_embeddings=64,
            deepstack_visual_indexes=[0, 1],
        ),
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.Qwen3VLForConditionalGeneration(config).to(torch.float32).save_pretrained(out)
    return out


def make_random_qwen3_vl_moe(out: Path) -> Path:
    """A random fp32 Qwen3-VL-MoE checkpoint: Qwen3VLMoeConfig with the published Qwen3-VL-30B-A3B's fields (every
    layer MoE, normalised top-k, the outer config untied beside its text config's tied default), random norms, its
    stacked experts rewritten in the published layout; transformers' own save (experts transposed) in out / "saved"."""
    import shutil

    import transformers

    from tools.make_tiny_vlm import publish_stacked_experts

    rope = {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [4, 2, 2], "mrope_interleaved": True}
    config = transformers.Qwen3VLMoeConfig(
        text_config=dict(
            vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=24, num_experts=4,
            num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, hidden_act="silu", attention_bias=False,
            rms_norm_eps=1e-6, max_position_embeddings=1024, rope_parameters=rope,
        ),
        vision_config=dict(
            depth=3, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=PATCH,
            temporal_patch_size=TEMPORAL, spatial_merge_size=MERGE, num_position_embeddings=64,
            hidden_act="gelu_pytorch_tanh", deepstack_visual_indexes=[0, 1],
        ),
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen3VLMoeForConditionalGeneration(config).to(torch.float32)
    with torch.no_grad():  # random norms, so that a wrong norm mapping shows
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    model.save_pretrained(out / "saved")
    out.mkdir(exist_ok=True)
    for path in (out / "saved").iterdir():
        shutil.copy(path, out / path.name)
    publish_stacked_experts(out)
    return out


def make_qwen3_5_vl(out: Path, tokenizer_from: Path, moe: bool = False) -> Path:
    """tiny_families' Qwen3.5 (Qwen3.5-MoE with `moe`) with the vision special tokens inside its tiny vocabulary."""
    import json

    from tests.megatron.tiny_families import make_qwen3_5

    hf_dir = make_qwen3_5(out, tokenizer_from, moe=moe)
    config = json.loads((hf_dir / "config.json").read_text())
    config.update(image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END)
    (hf_dir / "config.json").write_text(json.dumps(config))
    return hf_dir


def _engine(hf_dir: Path, freeze: bool = False, sgd: bool = False):
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings
    from slime_like.trainer.train_options import freeze_callback, trainable_filter

    trains = trainable_filter(SimpleNamespace(freeze_params_name_list=["visual"])) if freeze else None
    # SGD with lr 1 and no clipping: the weights move by the gradient (Adam's first step is its sign).
    settings = (
        OptimizerSettings(lr=1.0, optimizer="sgd", sgd_momentum=0.0, clip_grad=0.0, use_distributed_optimizer=False)
        if sgd
        else None
    )
    return MegatronTrainEngine(
        hf_dir,
        settings or OptimizerSettings(lr=1e-2),
        freeze=trains and freeze_callback(trains),
        max_tokens_per_micro_batch=4096,
    )


@pytest.mark.parametrize("layout", ["packed", "thd"])
def test_packed_logprobs_match_transformers(random_qwen2_5_vl, megatron_world, layout):
    """One row with a block-diagonal mask (Megatron's local attention), or THD with cu_seqlens (torch's SDPA per
    sequence: mrope's positions are taken per sequence by offset, as Transformer Engine takes them)."""
    from slime_like.trainer.megatron.engine import MegatronTrainEngine

    thd = {"layout": "thd", "torch_attention": "sdpa"} if layout == "thd" else {}
    engine = MegatronTrainEngine(random_qwen2_5_vl, None, max_tokens_per_micro_batch=4096, **thd)
    tokens = [t for t, _ in SAMPLES]
    got = engine.forward_logprobs(tokens, multimodal=[m for _, m in SAMPLES])
    assert len(engine._plan(tokens)) == 1  # both sequences in one packed micro-batch
    for ours, theirs in zip(got, hf_logprobs(random_qwen2_5_vl), strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_mrope_positions_match_get_rope_index(random_qwen2_5_vl):
    import transformers

    from slime_like.trainer.megatron.vision_language import image_token_mask, mrope_positions

    model = transformers.Qwen2_5_VLModel.from_pretrained(random_qwen2_5_vl, dtype=torch.float32)
    row = torch.tensor([SAMPLES[0][0] + SAMPLES[1][0]])
    per_sequence = torch.cat([torch.arange(len(t)) for t, _ in SAMPLES])[None]
    grids = torch.cat([m["image_grid_thw"] for _, m in SAMPLES])
    got = mrope_positions(image_token_mask(row, IMAGE, START), per_sequence, grids, MERGE)
    start = 0
    for tokens, images in SAMPLES:
        ids = torch.tensor([tokens])
        want, _ = model.get_rope_index(ids, (ids == IMAGE).int(), image_grid_thw=images["image_grid_thw"])
        assert torch.equal(got[:, :, start : start + len(tokens)], want)
        start += len(tokens)


def test_a_sampled_image_pad_is_text(random_qwen2_5_vl, megatron_world):
    """A pad token the policy sampled (no vision start before it) is a word, as SGLang serves it and transformers
    reads it (mm_token_type_ids 0): same log-probs as transformers', and it may carry loss."""
    import transformers

    from slime_like.trainer.megatron.vision_language import image_token_mask

    tokens, images = SAMPLES[0]
    sampled = [*tokens, IMAGE, IMAGE, 9]  # the response goes on with two stray pads
    ids = torch.tensor([sampled])
    real = torch.tensor([[t == IMAGE for t in tokens] + [False] * 3])
    assert torch.equal(image_token_mask(ids, IMAGE, START), real)
    engine = _engine(random_qwen2_5_vl)
    got = engine.forward_logprobs([sampled], multimodal=[images])[0]
    # transformers takes every pad for an image: feed the stray ones as an unused id with the pad's word embedding.
    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(random_qwen2_5_vl, dtype=torch.float32)
    unused = 254
    words = model.get_input_embeddings().weight
    with torch.no_grad():
        words[unused] = words[IMAGE]
        fed = torch.where(real | (ids != IMAGE), ids, unused)
        logits = model.eval()(input_ids=fed, mm_token_type_ids=real.int(), **images).logits[0]
    want = torch.log_softmax(logits, -1)[:-1].gather(-1, ids[0, 1:, None])[:, 0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    data = TrainData(tokens=[sampled], response_lengths=[7], loss_masks=[[1] * 7], multimodal_train_inputs=[images])
    assert engine.train_step(data.tokens, data, _sum_logprob_loss)["update_successful"] == 1.0


def _train_data() -> TrainData:
    tokens = [t for t, _ in SAMPLES]
    answers = [4, 3]
    return TrainData(
        tokens=tokens,
        response_lengths=answers,
        loss_masks=[[1] * n for n in answers],
        multimodal_train_inputs=[m for _, m in SAMPLES],
    )


def _sum_logprob_loss(logprobs: list[torch.Tensor], data: TrainData) -> torch.Tensor:
    return -sum(lp[-n:].sum() for lp, n in zip(logprobs, data.response_lengths, strict=True)) / 7


@pytest.mark.parametrize("freeze", [False, True], ids=["trained", "frozen"])
def test_train_step_reaches_the_vision_tower_unless_frozen(random_qwen2_5_vl, megatron_world, freeze):
    engine = _engine(random_qwen2_5_vl, freeze=freeze)
    chunk = engine.model[0].module
    before = {n: p.detach().clone() for n, p in chunk.named_parameters()}
    data = _train_data()
    metrics = engine.train_step(data.tokens, data, _sum_logprob_loss)
    assert metrics["update_successful"] == 1.0
    changed = {n for n, p in chunk.named_parameters() if not torch.equal(p, before[n])}
    vision = {n for n in before if n.startswith("visual.")}
    assert "decoder.layers.0.self_attention.linear_qkv.weight" in changed
    if freeze:
        assert not changed & vision
        assert all(not p.requires_grad for n, p in chunk.named_parameters() if n in vision)
    else:
        assert {"visual.patch_embed.proj.weight", "visual.blocks.0.attn.qkv.weight", "visual.merger.mlp.2.bias"} <= (
            changed
        )


def test_an_in_place_export_leaves_out_the_frozen_tower_while_engines_hold_it(
    random_qwen2_5_vl, megatron_world, tmp_path
):
    """--freeze-params-name-list visual: after a step, an in-place update's export (frozen_weights.py) is the full
    export less the tower's tensors (the full one, for disk checkpoints, keeps them); a trained tower is always in it;
    after loading a Megatron checkpoint whose tower moved, the frozen tower is sent again, until one with the HF
    checkpoint's tower is loaded."""
    frozen, trained = _engine(random_qwen2_5_vl, freeze=True), _engine(random_qwen2_5_vl)
    data = _train_data()
    for engine in (frozen, trained):
        engine.train_step(data.tokens, data, _sum_logprob_loss)
    full = {n for n, _ in frozen.export_hf_weights()}
    tower = {n for n in full if n.startswith("visual.")}
    assert tower and {n for n, _ in frozen.export_hf_weights(in_place=True)} == full - tower
    assert {n for n, _ in trained.export_hf_weights(in_place=True)} == full
    trained.save_checkpoint(tmp_path / "moved", with_optimizer=False)
    frozen.save_checkpoint(tmp_path / "kept", with_optimizer=False)
    frozen.load_checkpoint(tmp_path / "moved", load_optimizer=False, load_rng=False)
    assert {n for n, _ in frozen.export_hf_weights(in_place=True)} == full
    frozen.load_checkpoint(tmp_path / "kept", load_optimizer=False, load_rng=False)
    assert {n for n, _ in frozen.export_hf_weights(in_place=True)} == full - tower


def test_image_tokens_outside_the_loss_mask(random_qwen2_5_vl, megatron_world):
    engine = _engine(random_qwen2_5_vl)
    data = _train_data()
    data.response_lengths = [len(data.tokens[0]) - 1, 3]  # the first "response" holds its image
    data.loss_masks = [[1] * n for n in data.response_lengths]
    with pytest.raises(ValueError, match="image token is inside the loss mask"):
        engine.train_step(data.tokens, data, _sum_logprob_loss)


def test_export_and_torch_dist_round_trip_are_bit_exact(random_qwen2_5_vl, megatron_world, tmp_path):
    engine = _engine(random_qwen2_5_vl)
    original = safetensors_of(random_qwen2_5_vl)
    exported = {name: t.clone() for name, t in engine.export_hf_weights()}
    assert sorted(exported) == sorted(original)
    assert any(name.startswith("visual.blocks.1.") for name in exported)
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name
    data = _train_data()  # a step first: the optimizer state is saved too, and trained weights convert back
    engine.train_step(data.tokens, data, _sum_logprob_loss)
    converted = torch_dist_to_hf_round_trip(engine, random_qwen2_5_vl, tmp_path)
    assert not torch.equal(converted["visual.patch_embed.proj.weight"], original["visual.patch_embed.proj.weight"])
    # The conversion tools: HF -> torch_dist -> HF gives the checkpoint back bit-exactly.
    from tools import convert_hf_to_torch_dist, convert_torch_dist_to_hf

    convert_hf_to_torch_dist.main(["--hf-checkpoint", str(random_qwen2_5_vl), "--save", str(tmp_path / "td")])
    back = ["--hf-checkpoint", str(random_qwen2_5_vl), "--save", str(tmp_path / "back")]
    convert_torch_dist_to_hf.main(["--load", str(tmp_path / "td"), *back])
    returned = safetensors_of(tmp_path / "back")
    assert sorted(returned) == sorted(original)
    for name, tensor in original.items():
        assert torch.equal(returned[name], tensor), name


def vlm_train_run(hf_dir: str | Path) -> dict:
    """After init_parallel: the packed log-probs of vlm_samples, then one train step on them and the HF weights."""
    engine = _engine(Path(hf_dir), sgd=True)
    samples = vlm_samples(hf_dir)
    logprobs = engine.forward_logprobs([t for t, _ in samples], multimodal=[m for _, m in samples])
    data = _train_data()
    data.multimodal_train_inputs = [m for _, m in samples]
    metrics = engine.train_step(data.tokens, data, _sum_logprob_loss)
    return {"logprobs": logprobs, "metrics": metrics, "weights": {n: t.clone() for n, t in engine.export_hf_weights()}}


def test_vision_paths_not_built_are_named_at_start() -> None:
    from transformers import AutoConfig, Qwen3_5Config

    from slime_like.arguments import family_problem

    assert "vision path is not built yet" in family_problem("/ckpt", AutoConfig.for_model("qwen2_vl"))
    assert family_problem("/ckpt", Qwen3_5Config(), images=True) is None
    for built in ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"):
        assert family_problem("/ckpt", AutoConfig.for_model(built), images=True) is None
    problem = family_problem("/ckpt", AutoConfig.for_model("qwen3"), images=True)
    assert problem.startswith("--multimodal-keys with --hf-checkpoint /ckpt: model_type 'qwen3': it is a text-only")


def test_checkpoint_with_module_names_is_refused_with_the_fix(tmp_path) -> None:
    from safetensors.torch import save_file

    from slime_like.trainer.megatron.hf_weights import HFCheckpoint

    save_file({"model.language_model.layers.0.mlp.up_proj.weight": torch.zeros(2, 2)}, tmp_path / "model.safetensors")
    with pytest.raises(KeyError, match="transformers 4.52-4.57's names .* save_pretrained it again"):
        HFCheckpoint(tmp_path).get("model.layers.0.mlp.up_proj.weight", "decoder.layers.0.mlp.linear_fc1.weight")


@pytest.mark.parametrize("moe", [False, True], ids=["qwen3_5", "qwen3_5_moe"])
def test_qwen3_5_with_images_matches_transformers(moe, tiny_qwen3, megatron_world, tmp_path):
    """Qwen3.5's hybrid text model with interleaved mrope beside its vision tower (model.visual.*): packed log-probs
    of two image sequences equal transformers', a step moves the tower (frozen in a run without images), and the
    export plus the untouched MTP tensors is the checkpoint, bit-exactly."""
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.model import untrained_hf_weights
    from slime_like.trainer.megatron.optimizer import OptimizerSettings

    hf_dir = make_qwen3_5_vl(tmp_path / "qwen3_5", tiny_qwen3, moe=moe)
    samples = vlm_samples(hf_dir)
    expected = hf_logprobs(hf_dir)

    engine = MegatronTrainEngine(hf_dir, OptimizerSettings(lr=1e-2), max_tokens_per_micro_batch=4096)
    got = engine.forward_logprobs([t for t, _ in samples], multimodal=[m for _, m in samples])
    for ours, theirs in zip(got, expected, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    original = safetensors_of(hf_dir)
    exported = {n: t.clone() for n, t in engine.export_hf_weights()}
    assert any(n.startswith("model.visual.blocks.0.") for n in exported)
    assert sorted({**exported, **dict(untrained_hf_weights(engine.bridge))}) == sorted(original)
    assert all(torch.equal(t, original[n]) for n, t in exported.items())
    data = _train_data()
    data.multimodal_train_inputs = [m for _, m in samples]
    for train_vision in (True, False):
        trainer = (
            engine if train_vision else MegatronTrainEngine(hf_dir, OptimizerSettings(lr=1e-2), train_vision=False)
        )
        trainer.train_step(data.tokens, data, _sum_logprob_loss)
        after = dict(trainer.export_hf_weights())
        moved = not torch.equal(
            after["model.visual.patch_embed.proj.weight"], original["model.visual.patch_embed.proj.weight"]
        )
        assert moved == train_vision


@pytest.mark.parametrize(("family", "layout"), [("qwen2_5_vl", "packed"), ("qwen2_5_vl", "thd"), ("qwen3_5", "packed")])
def test_fused_mrope_matches_transformers(
    family, layout, random_qwen2_5_vl, tiny_qwen3, megatron_world, tmp_path, monkeypatch
):
    """--local-fused-elementwise: multimodal RoPE (Qwen2.5-VL's consecutive sections, Qwen3.5's interleaved ones) runs
    on the compiled RoPE kernel, with a one-row micro-batch and with THD; log-probs with images equal transformers'."""
    import json

    from slime_like.trainer.megatron import fused_ops
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.local_kernels_flags import LocalKernels

    calls = []

    def counted(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        calls.append(freqs.shape[0])
        return fused_ops.rope_math(t, freqs)

    monkeypatch.setattr(fused_ops, "_rope_fused", counted)
    hf_dir = random_qwen2_5_vl if family == "qwen2_5_vl" else make_qwen3_5_vl(tmp_path / "qwen3_5", tiny_qwen3)
    samples = vlm_samples(hf_dir)
    thd = {"layout": "thd", "torch_attention": "sdpa"} if layout == "thd" else {}
    with torch._dynamo.config.patch(disable=True):  # the fused norms' eager bodies (tests/megatron/test_fused_ops.py)
        engine = MegatronTrainEngine(
            hf_dir, None, max_tokens_per_micro_batch=4096, local_kernels=LocalKernels(fused_elementwise=True), **thd
        )
        assert engine.bridge.config.apply_rope_fusion
        got = engine.forward_logprobs([t for t, _ in samples], multimodal=[m for _, m in samples])
    text = json.loads((Path(hf_dir) / "config.json").read_text())["text_config"]
    rope_layers = text.get("layer_types", ["full_attention"] * text["num_hidden_layers"]).count("full_attention")
    assert len(calls) == 2 * rope_layers  # queries and keys of every attention layer, in the one micro-batch
    assert all(n >= sum(len(t) for t, _ in samples) for n in calls)  # frequencies per token, not per position
    for ours, theirs in zip(got, hf_logprobs(hf_dir), strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("moe", [False, True], ids=["qwen3_vl", "qwen3_vl_moe"])
def test_qwen3_vl_with_deepstack_matches_transformers(moe, megatron_world, tmp_path):
    """Qwen3-VL: Qwen3's layers with interleaved mrope, the tower's deepstack features added after the first two
    layers (forward hooks): packed log-probs equal transformers', a step trains the deepstack mergers, and the export is
    the checkpoint, bit-exactly. Qwen3-VL-MoE the same with Qwen3-MoE's layers (its outer config untied, as
    transformers reads it); its experts, stacked in the checkpoint, load from the published layout and transformers'
    transposed one alike, train, and come back bit-exactly through torch_dist."""
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings

    hf_dir = (make_random_qwen3_vl_moe if moe else make_random_qwen3_vl)(tmp_path / "qwen3_vl")
    expected = hf_logprobs(hf_dir)
    engine = MegatronTrainEngine(hf_dir, OptimizerSettings(lr=1e-2), max_tokens_per_micro_batch=4096)
    got = engine.forward_logprobs([t for t, _ in SAMPLES], multimodal=[m for _, m in SAMPLES])
    for ours, theirs in zip(got, expected, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    original = safetensors_of(hf_dir)
    exported = {n: t.clone() for n, t in engine.export_hf_weights()}
    assert sorted(exported) == sorted(original)
    assert all(torch.equal(t, original[n]) for n, t in exported.items())
    data = _train_data()
    engine.train_step(data.tokens, data, _sum_logprob_loss)
    after = dict(engine.export_hf_weights())
    trained = [f"model.visual.deepstack_merger_list.{i}.linear_fc2.weight" for i in (0, 1)]
    if moe:  # the stacked experts (exported whole) and the routers train too
        trained += [
            f"model.language_model.layers.{i}.mlp.{p}" for i in (0, 2) for p in ("experts.down_proj", "gate.weight")
        ]
    for name in trained:
        assert not torch.equal(after[name], original[name]), name
    if moe:
        assert not torch.equal(after["lm_head.weight"], after["model.language_model.embed_tokens.weight"])
        _stacked_experts_read_alike(hf_dir / "saved", hf_dir)
        torch_dist_to_hf_round_trip(engine, hf_dir, tmp_path)
        # An in-place update leaving out one expert (frozen) cannot send its layer's stacked tensor: said, not dropped.
        from slime_like.trainer.megatron.hf_weights import export_hf_weights

        one = next(p for n, p in engine.model[0].named_parameters() if "local_experts.1.linear_fc1" in n)
        with pytest.raises(ValueError, match="experts.gate_up_proj stacks 4 experts but the export holds 3"):
            list(export_hf_weights(engine.model, engine.bridge.hf_config, engine.bridge.config, frozenset({id(one)})))


def _stacked_experts_read_alike(saved: Path, published: Path) -> None:
    """Every expert's slice reads the same from transformers' save (experts transposed) as from the published layout."""
    from slime_like.trainer.megatron.hf_weights import HFCheckpoint
    from slime_like.trainer.megatron.stacked_experts import read_expert

    theirs, ours = HFCheckpoint(saved), HFCheckpoint(published)
    stacked = sorted(n for n in ours.names() if ".mlp.experts." in n)
    assert len(stacked) == 6
    for name in stacked:
        kind = "expert_gate_up" if name.endswith("gate_up_proj") else "expert_down"
        assert theirs.get(name, "-").shape != ours.get(name, "-").shape
        for e in range(4):
            assert torch.equal(read_expert(theirs, name, e, kind, 64, "-"), read_expert(ours, name, e, kind, 64, "-"))
