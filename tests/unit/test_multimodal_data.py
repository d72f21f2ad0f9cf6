"""--multimodal-keys data: images from parquet bytes, paths and data URLs, the processor's image tokens in the prompt
length, and bad rows named (or skipped and counted)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest

from buffer import multimodal as mm
from buffer.data_source import DataError, DataSource, PromptDataset


def _png(color: tuple[int, int, int], size: tuple[int, int] = (60, 40)) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def processor(tiny_qwen2_5_vl: Path):
    return mm.load_processor(str(tiny_qwen2_5_vl))


def _parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_parse_multimodal_keys() -> None:
    assert mm.parse_multimodal_keys('{"image": "images"}') == {"image": "images"}
    assert mm.parse_multimodal_keys(None) is None
    with pytest.raises(ValueError, match="must be JSON"):
        mm.parse_multimodal_keys("image=images")
    with pytest.raises(ValueError, match="only images"):
        mm.parse_multimodal_keys('{"video": "videos"}')


def test_image_forms(tmp_path: Path) -> None:
    png = _png((255, 0, 0))
    (tmp_path / "red.png").write_bytes(png)
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    forms = [
        png,
        {"bytes": png, "path": None},
        "red.png",
        str(tmp_path / "red.png"),
        url,
        {"type": "image", "image": url},
    ]
    for form in forms:
        image = mm.load_image(form, tmp_path)
        assert image.mode == "RGB" and image.size == (60, 40) and image.getpixel((0, 0)) == (255, 0, 0)
    with pytest.raises(mm.ImageError, match="not found"):
        mm.load_image("missing.png", tmp_path)
    with pytest.raises(mm.ImageError, match="not a readable image"):
        mm.load_image(b"not an image")


def test_build_messages_places_images() -> None:
    messages = mm.build_messages("Look <image> and <image>: how many?", ["a", "b"])
    assert messages == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look "},
                {"type": "image"},
                {"type": "text", "text": " and "},
                {"type": "image"},
                {"type": "text", "text": ": how many?"},
            ],
        }
    ]
    with pytest.raises(mm.ImageError, match="1 '<image>' placeholders .* 2 images"):
        mm.build_messages("one <image>", ["a", "b"])


def test_parquet_rows_become_image_samples(tmp_path: Path, processor) -> None:
    rows = [
        {"problem": "<image>What colour?", "images": [{"bytes": _png((0, 0, 255)), "path": None}], "answer": "blue"},
        {"problem": "<image><image>Same?", "images": [{"bytes": _png((0, 255, 0)), "path": None}] * 2, "answer": "y"},
    ]
    data = _parquet(tmp_path / "train.parquet", rows)
    dataset = PromptDataset(
        data, input_key="problem", label_key="answer", apply_chat_template=True,
        multimodal_keys={"image": "images"}, processor=processor,
    )  # fmt: skip
    first, second = dataset.prompts
    assert first.prompt.count("<|image_pad|>") == 1 and second.prompt.count("<|vision_start|>") == 2
    ids, train = mm.prompt_inputs(processor, first.prompt, first.images)
    pads = ids.count(processor.tokenizer.convert_tokens_to_ids("<|image_pad|>"))
    grid = train["image_grid_thw"]
    assert pads == int(grid.prod()) // 4 and pads > 1  # the pad expanded to one token per merged 2x2 patch block
    assert first.prompt_tokens == len(ids)  # prompt lengths count image tokens
    assert train["pixel_values"].shape[0] == int(grid.prod())
    group = DataSource(dataset, n_samples_per_prompt=2, shuffle=False).get_groups(1)[0]
    assert [len(s.multimodal_inputs["images"]) for s in group] == [1, 1]
    assert group[0].multimodal_inputs["images"] is not group[1].multimodal_inputs["images"]  # turns may add images


def test_max_prompt_len_counts_image_tokens(tmp_path: Path, processor) -> None:
    rows = [{"input": "<image>hi", "images": [_png((9, 9, 9), size)]} for size in [(40, 40), (300, 300)]]
    data = _parquet(tmp_path / "sizes.parquet", rows)
    small, large = PromptDataset(
        data, input_key="input", label_key=None, multimodal_keys={"image": "images"}, processor=processor
    ).prompts
    assert large.prompt_tokens > small.prompt_tokens  # only the image differs
    kept = PromptDataset(
        data, input_key="input", label_key=None, multimodal_keys={"image": "images"}, processor=processor,
        max_prompt_len=small.prompt_tokens,
    )  # fmt: skip
    assert len(kept) == 1 and kept.skipped["prompt_too_long"] == 1
    assert isinstance(kept.prompts[0].prompt, list)  # without --apply-chat-template: slime's messages


def test_bad_rows_named_or_skipped(tmp_path: Path, processor) -> None:
    (tmp_path / "ok.png").write_bytes(_png((1, 2, 3)))
    rows = [
        {"input": "<image>a", "images": ["ok.png"]},
        {"input": "<image>b", "images": ["gone.png"]},
        {"input": "<image>c", "images": [base64.b64encode(b"garbage" * 60).decode()]},
        {"input": "no placeholder", "images": ["ok.png"]},
    ]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kwargs = dict(input_key="input", label_key=None, multimodal_keys={"image": "images"}, processor=processor)
    with pytest.raises(DataError, match=r"rows.jsonl:2: column 'images', image 0: image file 'gone.png' not found"):
        PromptDataset(data, **kwargs)
    dataset = PromptDataset(data, skip_bad_rows=True, **kwargs)
    assert len(dataset) == 1 and dataset.skipped["bad_row"] == 3


def test_text_checkpoint_refused(tiny_qwen3: Path) -> None:
    with pytest.raises(ValueError, match="text-only checkpoint"):
        mm.load_processor(str(tiny_qwen3))


def test_merge_train_inputs() -> None:
    import torch

    a = {"pixel_values": torch.ones(4, 3), "image_grid_thw": torch.tensor([[1, 2, 2]])}
    b = {"pixel_values": torch.zeros(8, 3), "image_grid_thw": torch.tensor([[1, 2, 4]])}
    merged = mm.merge_train_inputs([a, None, b])
    assert merged["pixel_values"].shape == (12, 3) and merged["image_grid_thw"].tolist() == [[1, 2, 2], [1, 2, 4]]
    assert mm.merge_train_inputs([None]) is None


def test_flag_parses_with_slimes_meaning(base: list[str], tiny_qwen2_5_vl: Path) -> None:
    from slime_like.arguments import parse_args

    base = [str(tiny_qwen2_5_vl) if a == base[base.index("--hf-checkpoint") + 1] else a for a in base]
    args = parse_args(base + ["--multimodal-keys", '{"image": "images"}'])
    assert args.multimodal_keys == {"image": "images"}
    with pytest.raises(SystemExit):
        parse_args(base + ["--multimodal-keys", '{"audio": "clips"}'])


def test_image_samples_survive_json(processor) -> None:
    """A checkpoint's buffer state is JSON: a partly generated image sample comes back with its images and tensors."""
    from PIL import Image

    from slime_like.core.sample import Sample

    image = Image.new("RGB", (56, 56), (10, 200, 30))
    ids, train = mm.prompt_inputs(processor, mm.build_messages("<image>?", [image]), [image])
    sample = Sample(tokens=ids, multimodal_inputs={"images": [image]}, multimodal_train_inputs=train)
    back = Sample.from_dict(json.loads(json.dumps(sample.to_dict())))
    assert back.multimodal_inputs["images"][0].tobytes() == image.tobytes()
    for key, value in train.items():
        assert back.multimodal_train_inputs[key].dtype == value.dtype and back.multimodal_train_inputs[key].equal(value)


def test_http_urls_are_fetched_and_unreachable_ones_named(tmp_path: Path) -> None:
    import functools
    import http.server
    import threading

    (tmp_path / "blue.png").write_bytes(_png((0, 0, 255)))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert mm.load_image(f"{url}/blue.png").getpixel((0, 0)) == (0, 0, 255)
        with pytest.raises(mm.ImageError, match=r"could not be fetched .* offline, store the images in the data"):
            mm.load_image(f"{url}/missing.png")
    finally:
        server.shutdown()
        server.server_close()
