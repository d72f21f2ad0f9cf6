"""Make a distillation student from a teacher HF checkpoint: the same tokenizer and vocabulary, fewer decoder layers.

Example: python tools/make_student.py --teacher /tmp/smollm2 --out /tmp/student --drop-layers 12-15
The kept layers keep their trained weights (renumbered in order), as do the embeddings, final norm and LM head, so
the student is weaker than its teacher but not random: SmolLM2-135M-Instruct without 4 of its 30 layers still
writes fluent English but no longer names capitals (docs/distillation.md). Works for decoder checkpoints whose
layer weights are named `model.layers.<i>.` (Llama, Qwen2, Qwen3, their MoE variants).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

from slime_like.core.logs import setup_logging

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# Per-layer lists in a config (e.g. Qwen3's layer_types): they keep the entries of the kept layers.
_PER_LAYER_KEYS = ("layer_types", "mlp_only_layers")
_WEIGHT_FILES = ("*.safetensors", "model.safetensors.index.json", "*.bin", "pytorch_model.bin.index.json")


def parse_layers(spec: str) -> list[int]:
    """'12-15,20' -> [12, 13, 14, 15, 20]."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise ValueError(f"--drop-layers {spec!r}: use layer numbers and ranges, e.g. 12-15,20")
        out += range(int(first), int(last or first) + 1)
    return sorted(set(out))


def kept_layers(num_layers: int, drop: list[int]) -> list[int]:
    """The teacher layers the student keeps, in order; refuses drops outside the model or of every layer."""
    outside = [i for i in drop if i >= num_layers]
    if outside:
        raise ValueError(f"--drop-layers {outside}: the teacher has layers 0..{num_layers - 1} only")
    keep = [i for i in range(num_layers) if i not in set(drop)]
    if not keep:
        raise ValueError(f"--drop-layers drops all {num_layers} layers: keep at least one")
    return keep


def student_name(name: str, keep: list[int]) -> str | None:
    """The student's name of a teacher weight (None: its layer is dropped)."""
    match = _LAYER.match(name)
    if match is None:
        return name
    layer = int(match.group(1))
    return f"model.layers.{keep.index(layer)}.{match.group(2)}" if layer in keep else None


def make_student(teacher: Path, out: Path, drop: list[int]) -> Path:
    """Write the student (config, one safetensors file, tokenizer and every other file of the teacher) to `out`."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    config = json.loads((teacher / "config.json").read_text())
    keep = kept_layers(config["num_hidden_layers"], drop)
    shards = sorted(teacher.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{teacher}: no *.safetensors weights (convert .bin checkpoints with transformers)")
    weights = {}
    for shard in shards:
        with safe_open(shard, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                new = student_name(name, keep)
                if new is not None:
                    weights[new] = f.get_tensor(name)
    config["num_hidden_layers"] = len(keep)
    for key in _PER_LAYER_KEYS:
        if isinstance(config.get(key), list) and len(config[key]) == len(keep) + len(drop):
            config[key] = [config[key][i] for i in keep]
    out.mkdir(parents=True, exist_ok=True)
    for path in teacher.iterdir():  # tokenizer, chat template, generation config: the teacher's own
        if path.is_file() and not any(path.match(pattern) for pattern in _WEIGHT_FILES) and path.name != "config.json":
            shutil.copy2(path, out / path.name)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the tool."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher", required=True, help="the teacher's HF checkpoint directory")
    p.add_argument("--out", required=True, help="output HF directory of the student (created)")
    p.add_argument("--drop-layers", required=True, help="teacher layers to leave out, e.g. 12-15 or 3,7,11")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    """Make the student and print its directory."""
    args = parse_args(argv)
    setup_logging("make_student")
    try:
        drop = parse_layers(args.drop_layers)
        out = make_student(Path(args.teacher), Path(args.out), drop)
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"make_student: {exc}") from None
    print(out)
    return out


if __name__ == "__main__":
    main()
