"""slime's examples/geo3k_vlm_multi_turn/rollout.py, unchanged (tests/integration/slime_plugins/geo3k_vlm_multi_turn/,
importable as `examples.geo3k_vlm_multi_turn` as in slime's tree), rolls out one group on the tiny Qwen2.5-VL served by
SGLang's CPU engine, through our compat `slime` package (GenerateState with the processor, http_utils.post,
processing_utils, Sample.append_response_tokens) and qwen_vl_utils.

Its environment is the user's (--rollout-interaction-env-path, a file, with max_turns from --custom-config-path as
slime's geo3k_vlm_multi_turn_config.yaml sets them): after the first answer it shows a second picture, then ends. The
tiny random model cannot write answers, so every token but the vision ones stops a turn (one token per answer) and
decoding is greedy. Checked: both turns ran, the second with both pictures; each sample's multimodal_inputs hold the
two pictures and its multimodal_train_inputs the two images' tensors merged (slime's per-turn concat); the
observation's tokens are masked out of the loss; SGLang's log-probs of both answers equal transformers' forward over
the whole sequence with both images (fp32).
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rollout.manager import RolloutManager
from rollout.sglang_server import SGLangServer
from slime_like.arguments import parse_args
from slime_like.core.sample import Sample, Status

pytest.importorskip("qwen_vl_utils", reason="slime's multi-turn VLM rollout imports qwen_vl_utils (qwen-vl-utils)")

HERE = Path(__file__).resolve().parent
N = 2
TOLERANCE = 1e-4

PICTURE_ENV = """
from PIL import Image, ImageDraw

from examples.geo3k_vlm_multi_turn.base_env import BaseInteractionEnv


class PictureEnv(BaseInteractionEnv):
    \"\"\"After the first answer, a second picture and a question about it; the episode ends after the second.\"\"\"

    def __init__(self):
        self.turn = 0

    def reset(self):
        self.turn = 0
        return {}, {}

    def step(self, response_text):
        self.turn += 1
        if self.turn > 1:
            return {}, True, {}
        image = Image.new("RGB", (84, 56), (255, 255, 255))
        ImageDraw.Draw(image).rectangle([8, 8, 40, 40], fill=(200, 30, 30))
        return {"obs_str": "And in this one?", "multi_modal_data": {"image": [image]}}, False, {}


def build_env(sample=None, args=None, **kwargs):
    return PictureEnv()
"""


def _png() -> bytes:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (112, 112), (255, 255, 255))
    ImageDraw.Draw(image).rectangle([10, 10, 50, 50], fill=(20, 90, 200))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The data (one image row), the environment file, the config, and `examples` as slime's tree has it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("geo3k-mt")
    row = {"problem": "<image>How many squares?", "images": [{"bytes": _png(), "path": None}], "answer": "1"}
    pq.write_table(pa.Table.from_pylist([row]), root / "train.parquet")
    (root / "picture_env.py").write_text(PICTURE_ENV)
    (root / "config.yaml").write_text(f"max_turns: 2\nrollout_interaction_env_path: {root / 'picture_env.py'}\n")
    (root / "examples").mkdir()
    (root / "examples" / "__init__.py").write_text("")
    (root / "examples" / "geo3k_vlm_multi_turn").symlink_to(HERE / "slime_plugins" / "geo3k_vlm_multi_turn")
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m == "examples" or m.startswith("examples.")]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def manager(tiny_qwen2_5_vl: Path, task: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RolloutManager]:
    server = SGLangServer(tiny_qwen2_5_vl, dtype="float32", log_dir=tmp_path_factory.mktemp("logs")).start()
    tokens = range(512)  # the tiny tokenizer's ids below its vision tokens (make_tiny_vlm.VISION_TOKENS: 512-516)
    args = parse_args(
        [
            "--hf-checkpoint", str(tiny_qwen2_5_vl), "--prompt-data", str(task / "train.parquet"),
            "--input-key", "problem", "--label-key", "answer", "--multimodal-keys", '{"image": "images"}',
            "--apply-chat-template", "--rollout-batch-size", "1", "--n-samples-per-prompt", str(N),
            "--num-rollout", "1", "--rollout-max-response-len", "8", "--rollout-max-context-len", "512",
            "--rollout-top-k", "1", "--rollout-stop-token-ids", *map(str, tokens),
            "--custom-generate-function-path", "examples.geo3k_vlm_multi_turn.rollout.generate",
            "--custom-config-path", str(task / "config.yaml"), "--output-dir", str(task / "out"),
        ]
    )  # fmt: skip
    m = RolloutManager(args, server_urls=[server.url])
    try:
        yield m
    finally:
        m.shutdown()
        server.stop()


def hf_log_probs(model_path: Path, sample: Sample) -> list[float]:
    """transformers' log-probs of the sample's tokens after its prompt, given all its images, fp32."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32).eval()
    ids = torch.tensor([sample.tokens])
    inputs = sample.multimodal_train_inputs
    with torch.no_grad():
        logits = model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values=inputs["pixel_values"],
            image_grid_thw=inputs["image_grid_thw"],
            mm_token_type_ids=(ids == model.config.image_token_id).long(),
        ).logits[0]
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    start = len(sample.tokens) - sample.response_length
    return [log_probs[start - 1 + i, t].item() for i, t in enumerate(sample.tokens[start:])]


def test_slimes_multi_turn_vlm_rollout_shows_a_picture_between_turns(
    manager: RolloutManager, tiny_qwen2_5_vl: Path
) -> None:
    from buffer import multimodal as mm

    groups, _ = manager.generate(0)
    samples = [s for g in groups for s in g]
    assert len(samples) == N
    pad = mm.load_processor(str(tiny_qwen2_5_vl)).tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for sample in samples:
        assert sample.status == Status.COMPLETED, sample.status
        assert len(sample.multimodal_inputs["images"]) == 2  # the row's picture and the environment's
        grid = sample.multimodal_train_inputs["image_grid_thw"]
        assert grid.shape[0] == 2 and sample.multimodal_train_inputs["pixel_values"].shape[0] == int(grid.prod(1).sum())
        assert sample.tokens.count(pad) == int(grid.prod(dim=1).sum()) // 4
        mask = sample.loss_mask
        assert len(mask) == sample.response_length and mask[0] == 1 and mask[-1] == 1 and sum(mask) == 2
        assert sample.tokens[len(sample.tokens) - sample.response_length :].count(pad) > 0  # the picture's tokens
        ours = hf_log_probs(tiny_qwen2_5_vl, sample)
        answers = [(a, b) for a, b, m in zip(ours, sample.rollout_log_probs, mask, strict=True) if m]
        assert max(abs(a - b) for a, b in answers) < TOLERANCE, answers
