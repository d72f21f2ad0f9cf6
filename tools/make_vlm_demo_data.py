"""Write the VLM demo's data: pictures this tool draws (1-4 coloured squares) and the question "how many squares?".

Each picture is a small canvas split into a 2x2 grid; a random non-empty set of cells each holds one filled square
of a random colour, size and position inside its cell, so the answer (1-4) is a count a tiny vision tower can learn
from its pixels. Files are parquet in slime's geo3k columns (examples/geo3k_vlm): `problem` (the prompt with an
`<image>` placeholder), `images` (a list of `{"bytes": PNG, "path": None}` structs, as Hugging Face datasets store
images) and `answer` (the label). train.parquet: RL prompts; eval.parquet: held-out pictures; sft.parquet: other
pictures for the warm start (tools/sft_warmstart_vlm.py), so neither RL nor eval pictures are seen in SFT.

Example: python tools/make_vlm_demo_data.py --out /tmp/vlm-data --size 112
Train with --input-key problem --label-key answer --multimodal-keys '{"image": "images"}' --apply-chat-template.
"""

from __future__ import annotations

import argparse
import io
import random
from pathlib import Path
from typing import Any

QUESTION = "<image>How many squares are in the picture? Answer with a number."
BACKGROUND = (255, 255, 255)


def draw_squares(rng: random.Random, size: int) -> tuple[bytes, int]:
    """One picture (PNG bytes, size x size) and its number of squares: 1-4 in distinct cells of a 2x2 grid."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), BACKGROUND)
    draw = ImageDraw.Draw(image)
    cell = size // 2
    count = rng.randint(1, 4)
    for index in rng.sample(range(4), count):
        side = rng.randint(cell * 2 // 5, cell * 4 // 5)
        x0 = (index % 2) * cell + rng.randint(0, cell - side)
        y0 = (index // 2) * cell + rng.randint(0, cell - side)
        color = tuple(rng.randint(0, 200) for _ in range(3))  # never near the white background
        draw.rectangle([x0, y0, x0 + side - 1, y0 + side - 1], fill=color)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue(), count


def rows(n: int, rng: random.Random, size: int) -> list[dict[str, Any]]:
    """n geo3k-style rows: problem, images (one PNG struct), answer."""
    out = []
    for _ in range(n):
        png, count = draw_squares(rng, size)
        out.append({"problem": QUESTION, "images": [{"bytes": png, "path": None}], "answer": str(count)})
    return out


def make_vlm_demo_data(
    out: str | Path, n_train: int = 512, n_eval: int = 64, n_sft: int = 512, size: int = 112, seed: int = 0
) -> Path:
    """Write train.parquet, eval.parquet and sft.parquet (disjoint random pictures) under `out`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", n_train), ("eval", n_eval), ("sft", n_sft)):
        pq.write_table(pa.Table.from_pylist(rows(n, rng, size)), out / f"{name}.parquet")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the tool."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output folder (created)")
    p.add_argument("--n-train", type=int, default=512)
    p.add_argument("--n-eval", type=int, default=64)
    p.add_argument("--n-sft", type=int, default=512)
    p.add_argument("--size", type=int, default=112, help="canvas side in pixels (the tiny VLM's processor: <= 112)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


if __name__ == "__main__":
    a = parse_args()
    print(make_vlm_demo_data(a.out, a.n_train, a.n_eval, a.n_sft, a.size, a.seed))
