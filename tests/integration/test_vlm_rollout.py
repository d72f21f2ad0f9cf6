"""Image rows through a real rollout: the tiny Qwen2.5-VL served by SGLang's CPU engine behind the router, a parquet of
image rows read with --multimodal-keys, the default generate sending the prompt's ids with `image_data`.

Checked: the prompt ids are the processor's (each image's pad expanded), samples carry the images and the
processor's tensors, and SGLang's rollout log-probs equal transformers' log-probs of the same ids and image (fp32)
within 1e-4 (parity item 4's SGLang half). A second test adds an image between turns (slime's geo3k_vlm_multi_turn
contract: images appended to multimodal_inputs, train inputs merged per turn) and checks the second turn's log-probs
against transformers' forward over the whole sequence with both images.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from buffer import multimodal as mm
from rollout.hooks import load_hooks
from rollout.manager import RolloutManager
from rollout.sglang_server import SGLangServer
from slime_like.arguments import parse_args
from slime_like.core.sample import Sample, Status

TOLERANCE = 1e-4
N = 2
MULTI_TURN = """
from buffer import multimodal as mm
from rollout.generate import append_model_tokens, call_model, finish_status, sample_prompt_ids


async def generate(ctx, sample, params):
    \"\"\"Two turns: the model answers, the environment shows a second image, the model answers again.\"\"\"
    processor = mm.load_processor(ctx.args.hf_checkpoint)
    sample.tokens = sample_prompt_ids(ctx, sample)
    out = await call_model(ctx, sample, dict(params, max_new_tokens=4, ignore_eos=True))
    append_model_tokens(sample, out)
    image = mm.load_image(sample.metadata["second_image"])
    message = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "And now?"}]}
    turn = mm.observation_inputs(processor, message, [image])
    mm.append_observation(sample, turn)
    out = await call_model(ctx, sample, dict(params, max_new_tokens=4, ignore_eos=True))
    append_model_tokens(sample, out)
    sample.status, _ = finish_status(ctx, out)
    return sample


async def agent(base_url, api_key, sample):
    \"\"\"An OpenAI SDK agent: an image in the first message, a second image in the next user turn.\"\"\"
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    first = mm.image_data_url(sample.multimodal_inputs["images"][0])
    second = mm.image_data_url(mm.load_image(sample.metadata["second_image"]))
    messages = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": first}}, {"type": "text", "text": "How many squares?"}]}]
    for url in (second, None):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=4, temperature=1.0)
        if url is None:
            break
        messages += [{"role": "assistant", "content": reply.choices[0].message.content}, {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "And now?"}]}]


async def openai_generate(ctx, sample, params):
    from plugins.openai_agent import run_openai_agent

    return await run_openai_agent(ctx, sample, params, agent, timeout=60.0)
"""


def _png(color: tuple[int, int, int], size: tuple[int, int]) -> bytes:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", size, color)
    ImageDraw.Draw(image).rectangle([5, 5, size[0] // 2, size[1] // 2], fill=(255 - color[0], 40, 200))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("vlm")
    rows = [
        {
            "problem": f"<image>How many squares? {i}",
            "images": [{"bytes": _png((30 * i, 100, 50), (56 + 28 * i, 84)), "path": None}],
            "answer": str(i),
            "metadata": {"second_image": _png((200, 10 * i, 90), (70, 60))},
        }
        for i in range(2)
    ]
    pq.write_table(pa.Table.from_pylist(rows), root / "geo.parquet")
    (root / "vlm_turns.py").write_text(MULTI_TURN)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    sys.modules.pop("vlm_turns", None)


@pytest.fixture(scope="module")
def vlm_server(tiny_qwen2_5_vl: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServer]:
    server = SGLangServer(tiny_qwen2_5_vl, dtype="float32", log_dir=tmp_path_factory.mktemp("vlm-logs"))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def manager(tiny_qwen2_5_vl: Path, task: Path, vlm_server: SGLangServer) -> Iterator[RolloutManager]:
    args = parse_args(
        [
            "--hf-checkpoint", str(tiny_qwen2_5_vl), "--prompt-data", str(task / "geo.parquet"),
            "--input-key", "problem", "--label-key", "answer", "--multimodal-keys", '{"image": "images"}',
            "--apply-chat-template", "--rollout-batch-size", "2", "--n-samples-per-prompt", str(N),
            "--num-rollout", "2", "--rollout-max-response-len", "40", "--rollout-temperature", "1.0",
            "--output-dir", str(task / "out"),
        ]
    )  # fmt: skip
    m = RolloutManager(args, server_urls=[vlm_server.url])  # and a router in front (the fleet starts one)
    yield m
    m.shutdown()


def _given(sample: Sample) -> list[int]:
    """The positions of tokens the model did not sample (the prompt, inserted turns)."""
    response = sample.loss_mask or [0] * sample.response_length
    return list(range(sample.prompt_length)) + [sample.prompt_length + i for i, m in enumerate(response) if not m]


def hf_log_probs(model_path: Path, sample: Sample) -> list[float]:
    """transformers' log-probs of the sample's response tokens given its ids and images, fp32. The images' features
    go where the processor put image tokens; a pad token the random model sampled stays a token, as SGLang serves it
    (transformers would take every pad token for an image's)."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32).eval()
    ids = torch.tensor([sample.tokens])
    image = torch.zeros_like(ids, dtype=torch.bool)
    image[0, _given(sample)] = ids[0, _given(sample)] == model.config.image_token_id
    inputs = sample.multimodal_train_inputs
    with torch.no_grad():
        core = model.model
        embeds = core.get_input_embeddings()(ids)
        features = core.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output
        embeds[image] = torch.cat(features)
        # transformers 5 places the images by mm_token_type_ids (their M-RoPE positions)
        positions, _ = core.get_rope_index(ids, mm_token_type_ids=image.long(), image_grid_thw=inputs["image_grid_thw"])
        logits = model(inputs_embeds=embeds, position_ids=positions, attention_mask=torch.ones_like(ids)).logits[0]
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    start = sample.prompt_length
    return [log_probs[start - 1 + i, t].item() for i, t in enumerate(sample.tokens[start:])]


def _check_images(sample: Sample, processor, n_images: int) -> None:
    grid = sample.multimodal_train_inputs["image_grid_thw"]
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert len(sample.multimodal_inputs["images"]) == n_images == grid.shape[0]
    given = [sample.tokens[i] for i in _given(sample)]  # not sampled (the random model may sample a pad)
    assert given.count(pad) == int(grid.prod(dim=1).sum()) // 4  # one token per merged 2x2 patch block
    assert sample.multimodal_train_inputs["pixel_values"].shape[0] == int(grid.prod(dim=1).sum())


def test_image_rows_roll_out_with_sglangs_log_probs_equal_to_transformers(
    manager: RolloutManager, tiny_qwen2_5_vl: Path
) -> None:
    groups, _ = manager.generate(0)
    processor = mm.load_processor(str(tiny_qwen2_5_vl))
    samples = [s for g in groups for s in g]
    assert len(samples) == 2 * N
    worst = 0.0
    for sample in samples:
        assert sample.status in (Status.COMPLETED, Status.TRUNCATED) and sample.response_length > 0
        _check_images(sample, processor, 1)
        ours = hf_log_probs(tiny_qwen2_5_vl, sample)
        worst = max(worst, max(abs(a - b) for a, b in zip(ours, sample.rollout_log_probs, strict=True)))
    assert worst < TOLERANCE, worst
    print(f"VLM rollout log-probs vs transformers: max |diff| {worst:.2e}")


def test_an_image_between_turns(manager: RolloutManager, tiny_qwen2_5_vl: Path) -> None:
    manager.args.custom_generate_function_path = "vlm_turns.generate"
    manager.hooks = load_hooks(manager.args)  # the rollouts after this one generate with it
    groups, _ = manager.generate(1)
    processor = mm.load_processor(str(tiny_qwen2_5_vl))
    for sample in (s for g in groups for s in g):
        _check_images(sample, processor, 2)
        assert sample.loss_mask.count(0) > 0 and sum(sample.loss_mask) == 8  # two answers of 4; the turn masked
        ours = hf_log_probs(tiny_qwen2_5_vl, sample)
        trained = [(a, b) for a, b, m in zip(ours, sample.rollout_log_probs, sample.loss_mask, strict=True) if m]
        assert max(abs(a - b) for a, b in trained) < TOLERANCE


def test_an_openai_agent_sends_images(manager: RolloutManager, tiny_qwen2_5_vl: Path) -> None:
    """Chat Completions image_url parts on the agents' endpoint: the branch keeps both images, exact tokens."""
    manager.args.custom_generate_function_path = "vlm_turns.openai_generate"
    manager.hooks = load_hooks(manager.args)
    groups, _ = manager.generate(1)
    processor = mm.load_processor(str(tiny_qwen2_5_vl))
    for sample in (s for g in groups for s in g):
        assert sample.status != Status.FAILED, sample.metadata
        _check_images(sample, processor, 2)
        assert sum(sample.loss_mask) == 8 and sample.metadata["openai_turns"] == 2
        ours = hf_log_probs(tiny_qwen2_5_vl, sample)
        trained = [(a, b) for a, b, m in zip(ours, sample.rollout_log_probs, sample.loss_mask, strict=True) if m]
        assert max(abs(a - b) for a, b in trained) < TOLERANCE
