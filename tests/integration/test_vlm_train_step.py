"""Image rows through the rollout, a train step and a weight update on the real stack (issue 34's trainer half).

The tiny Qwen2.5-VL with its processor (tools/make_tiny_vlm.py) served by SGLang's CPU engine; a parquet of image rows
read with --multimodal-keys; the rollout's samples become the training batch (their processor tensors in
TrainData.multimodal_train_inputs) and TrainActor trains on it. Checked: the trained ids are the sampled ids, image
tokens stay out of the loss, the old-policy and reference forwards saw the images (ratio exactly 1, KL 0 on the first
step), the trainer's log-probs of the sampled tokens equal SGLang's, the step moves the vision tower; then an in-place
update carries the vision tower and the post-update check, whose probe holds an image, passes, while an update
without the vision tower's tensors fails it. First, a run with the tower frozen (--freeze-params-name-list visual): its
in-place update sends no vision tensor (megatron/frozen_weights.py) and the check passes.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from buffer.train_data import build_train_data
from rollout.manager import RolloutManager
from rollout.sglang_server import SGLangServer
from slime_like.arguments import parse_args
from slime_like.core.errors import WeightUpdateError

TOLERANCE = 1e-4  # fp32 on both sides
VISION = ("visual.", "model.visual.")  # the tower's HF names (Qwen2.5-VL, Qwen3-VL)


def _png(color: tuple[int, int, int], size: tuple[int, int]) -> bytes:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", size, color)
    ImageDraw.Draw(image).ellipse([4, 4, size[0] // 2, size[1] - 6], fill=(255 - color[0], 60, 180))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("vlm-train")
    table = [
        {"problem": f"<image>How many circles? {i}", "images": [{"bytes": _png((40 * i, 120, 60), (56 + 28 * i, 56))}],
         "answer": str(i)}
        for i in range(2)
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(table), root / "rows.parquet")
    return root


@pytest.fixture(params=["qwen2_5_vl", "qwen3_vl"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint of each VL family (Qwen3-VL: interleaved mrope, deepstack, model.visual.* names)."""
    if request.param == "qwen2_5_vl":
        return request.getfixturevalue("tiny_qwen2_5_vl")
    from tests.conftest import make_tiny_vlm

    return make_tiny_vlm(tmp_path_factory, request.param)


@pytest.fixture
def server(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServer]:
    served = SGLangServer(checkpoint, dtype="float32", log_dir=tmp_path_factory.mktemp("vlm-train-logs"))
    try:
        yield served.start()
    finally:
        served.stop()


def test_image_rows_train_and_update_the_vision_tower(checkpoint, rows, server, monkeypatch) -> None:
    from slime_like.trainer.actor import TrainActor
    from slime_like.trainer.weights.check import check_servers
    from slime_like.trainer.weights.tensor import TensorTransport

    argv = (
        ["--hf-checkpoint", str(checkpoint), "--prompt-data", str(rows / "rows.parquet"), "--input-key", "problem",
         "--label-key", "answer", "--multimodal-keys", '{"image": "images"}', "--apply-chat-template",
         "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4", "--num-rollout", "1",
         "--rollout-max-response-len", "6", "--rollout-temperature", "1.0", "--lr", "3e-2", "--use-kl-loss",
         "--kl-loss-coef", "0.1", "--check-weight-update", "--output-dir", str(rows / "out")]
    )  # fmt: skip
    args = parse_args(argv)
    manager = RolloutManager(args, server_urls=[server.url])
    try:
        groups, _ = manager.generate(0)
    finally:
        manager.shutdown()
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, os.environ.get(key, "0"))  # TrainActor sets them; restored after the test
    samples = [s for group in groups for s in group]
    # Random rewards may tie a group: give each group one right and one wrong answer, so every sample has an advantage.
    for group in groups:
        for k, sample in enumerate(group):
            sample.reward = float(k == 0)
    data = build_train_data(groups)
    assert data.tokens == [list(s.tokens) for s in samples]  # trained ids == sampled ids
    pad = _image_token(checkpoint)
    for tokens, length, images in zip(data.tokens, data.response_lengths, data.multimodal_train_inputs, strict=True):
        assert pad in tokens[: len(tokens) - length] and pad not in tokens[len(tokens) - length :]
        assert images["pixel_values"].shape[0] == int(images["image_grid_thw"].prod(-1).sum())

    # The frozen tower's run first, while the server holds the checkpoint's tower: the update leaves it out (CPU: the
    # tensor transport records every name it shared) and --check-weight-update's image probe still matches.
    frozen = TrainActor(parse_args([*argv, "--freeze-params-name-list", "visual"]), 0, "127.0.0.1", 0)
    frozen.train(0, data)
    try:
        frozen.update_weights([server.url], 1, "tensor", str(rows / "out"))
        sent = frozen.transport.transports["tensor"]._seen
        assert sent and not any(n.startswith(VISION) for n in sent)
    finally:
        frozen.transport.close()

    actor = TrainActor(args, 0, "127.0.0.1", 0)
    engine = actor.engine
    before = {n: t.clone() for n, t in engine.export_hf_weights()}
    metrics = actor.train(0, data)
    assert metrics["train/ppo_ratio_abs_dev"] == 0.0  # the old-policy forward saw the same images
    assert metrics["train/kl_loss"] == 0.0  # and so did the reference's
    assert metrics["train/train_rollout_logprob_abs_diff"] < TOLERANCE  # Megatron's log-probs equal SGLang's
    after = dict(engine.export_hf_weights())
    tower = next(n for n in after if n.endswith("visual.blocks.0.attn.qkv.weight"))
    assert not torch.equal(after[tower], before[tower])

    try:  # the trained tower goes with the update, and --check-weight-update passes
        actor.update_weights([server.url], 2, "tensor", str(rows / "out"))
        assert any(n.startswith(VISION) for n in actor.transport.transports["tensor"]._seen)
    finally:
        actor.transport.close()
    transport = TensorTransport([server.url], 64 * 1024, timeout_s=60)
    try:
        actor.train(1, data)  # the weights move again; the server gets all but the vision tower
        text = ((n, t) for n, t in engine.export_hf_weights() if not n.startswith(VISION))
        transport.update(text, 3)
        with pytest.raises(WeightUpdateError, match="after the update to version 3"):
            check_servers(engine, [server.url], TOLERANCE, rank=0, when="after the update to version 3")
    finally:
        transport.close()


def _image_token(hf_dir: Path) -> int:
    import json

    return int(json.loads((hf_dir / "config.json").read_text())["image_token_id"])
