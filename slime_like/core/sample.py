"""The Sample type shared by rollout, buffer and training: our contract, the only one core code reads.

slime's `Sample` (its extra fields and helpers) is a subclass at the edge, in the compatibility package
(`slime.utils.types`); the plugin loader switches `new_sample` to it when slime's contract is in use, so slime
plugins get slime samples (docs/plugins.md, "Plugins written for slime").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any


class Status(enum.StrEnum):
    """Lifecycle of one generated sample."""

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


# meta_info key of a streamed /generate answer (rollout.sglang_stream.read_stream): [[version, tokens], ...] over
# its output tokens, each version as the server reported it.
VERSION_SPANS_KEY = "weight_version_spans"
NO_VERSION = -1  # a version span's version for tokens no known weight version generated
# meta_info key of a /generate answer asked for `return_routed_experts` (R3): base64 of int32 [tokens - 1, layers,
# topk], the experts every token of the sequence but the last (never fed to the model) was routed to.
ROUTED_EXPERTS_KEY = "routed_experts"
# metadata key set by Sample.exclude_from_loss: the sample trains with loss mask 0.
EXCLUDED_FROM_LOSS = "excluded_from_loss"


def decode_routed_experts(encoded: Any, rows: int, num_layers: int, topk: int) -> Any:
    """SGLang's routed experts (base64 or raw int32) as a numpy int32 array [rows, num_layers, topk]."""
    import base64

    import numpy as np

    raw = base64.b64decode(encoded) if isinstance(encoded, str) else encoded
    flat = np.frombuffer(raw, dtype=np.int32) if isinstance(raw, bytes | bytearray) else np.asarray(raw, np.int32)
    if flat.size != rows * num_layers * topk:
        raise ValueError(
            f"SGLang returned {flat.size} routed-expert ids; {rows} tokens x {num_layers} layers x top-{topk} need "
            f"{rows * num_layers * topk} (are --num-layers / --moe-router-topk the served model's?)"
        )
    return flat.reshape(rows, num_layers, topk).copy()  # frombuffer is read-only


def version_number(version: Any) -> int:
    """A weight version as SGLang reports it (a string) as an int; NO_VERSION when it is not a number."""
    text = str(version) if version is not None else ""
    return int(text) if text.isdigit() else NO_VERSION


@dataclass
class Sample:
    """One prompt and (after rollout) one response with its tokens, log-probs and reward."""

    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = field(default_factory=list)  # prompt tokens followed by response tokens
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None  # one entry per response token
    rollout_log_probs: list[float] | None = None  # one entry per response token
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    group_index: int | None = None
    index: int | None = None
    weight_version: int | None = None  # the version of the last answer's weights when it finished
    # [[weight_version, n_tokens], ...] in response order, over every response token: which weights generated each
    # stretch. A request that spans weight updates (--pause-generation-mode retract/in_place) gives one per version.
    # Version -1 (NO_VERSION): no weights generated them (tool or environment tokens, loss mask 0), or they came
    # without a numeric version. Filled by rollout.generate.append_model_tokens (and slime's append_response_tokens);
    # a generate function that appends tokens itself may leave them uncovered.
    version_spans: list[list[int]] = field(default_factory=list, kw_only=True)
    teacher_log_probs: list[float] | None = field(default=None, kw_only=True)  # --use-opd: the teacher's, per token
    # R3 (--use-rollout-routing-replay): int32 [len(tokens) - 1, num_layers, topk] (decode_routed_experts).
    rollout_routed_experts: Any = field(default=None, kw_only=True)
    # Vision-language rows (--multimodal-keys, buffer/multimodal.py; slime's fields): the images SGLang is sent with
    # the tokens ({"images": [PIL images]}, in the order of their tokens), and the processor's tensors of those images
    # the trainer feeds the vision tower ({"pixel_values": ..., "image_grid_thw": ...}; made at the first generate).
    multimodal_inputs: dict[str, Any] | None = field(default=None, kw_only=True)
    multimodal_train_inputs: dict[str, Any] | None = field(default=None, kw_only=True)

    @property
    def prompt_length(self) -> int:
        """Number of prompt tokens at the front of `tokens`."""
        return len(self.tokens) - self.response_length

    @property
    def effective_response_length(self) -> int:
        """Response tokens the loss sees: sum of the loss mask (the response length without a mask)."""
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

    def oldest_version(self) -> int | None:
        """The oldest weight version that generated any response token (None: no span names a version)."""
        return min((v for v, n in self.version_spans if v != NO_VERSION and n > 0), default=None)

    def add_version_spans(self, n_tokens: int, meta_info: dict[str, Any] | None = None) -> None:
        """Extend `version_spans` over `n_tokens` response tokens just appended: from one /generate answer's
        meta_info (its streamed spans when they cover exactly these tokens, else its final weight version for all),
        or as NO_VERSION without one (tokens no model generated, or of unknown version)."""
        if n_tokens <= 0:
            return
        streamed = (meta_info or {}).get(VERSION_SPANS_KEY)
        if streamed and sum(n for _, n in streamed) == n_tokens:
            spans = [(version_number(v), int(n)) for v, n in streamed]
        elif meta_info is not None:
            spans = [(version_number(meta_info.get("weight_version")), n_tokens)]
        else:
            spans = [(NO_VERSION, n_tokens)]
        for version, n in spans:
            if self.version_spans and self.version_spans[-1][0] == version:
                self.version_spans[-1][1] += n
            elif n > 0:
                self.version_spans.append([version, n])

    def reset(self, metadata: dict[str, Any]) -> None:
        """Back to an ungenerated sample of the same prompt (same index), with `metadata` as it was served."""
        self.tokens, self.response, self.response_length = [], "", 0
        self.reward, self.loss_mask, self.rollout_log_probs = None, None, None
        self.status, self.weight_version, self.metadata = Status.PENDING, None, dict(metadata)
        self.version_spans, self.teacher_log_probs = [], None
        self.multimodal_train_inputs = None  # made again from the images with the prompt's tokens

    def exclude_from_loss(self) -> None:
        """Train with loss mask 0; the sample keeps its place in its group's reward statistics."""
        self.loss_mask = [0] * self.response_length
        self.metadata[EXCLUDED_FROM_LOSS] = True

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (status as its string value); attributes set on the sample are included."""
        d = dict(self.__dict__)
        if hasattr(d["rollout_routed_experts"], "tolist"):  # an array (R3): nested lists for JSON
            d["rollout_routed_experts"] = d["rollout_routed_experts"].tolist()
        d["status"] = self.status.value
        d["multimodal_inputs"] = _encode_images(d["multimodal_inputs"])
        d["multimodal_train_inputs"] = _encode_tensors(d["multimodal_train_inputs"])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sample:
        """Inverse of `to_dict`; keys that are not fields become attributes."""
        d = dict(d)
        d["status"] = Status(d.get("status", "pending"))
        d["multimodal_inputs"] = _decode_images(d.get("multimodal_inputs"))
        d["multimodal_train_inputs"] = _decode_tensors(d.get("multimodal_train_inputs"))
        names = {f.name for f in fields(cls)}
        sample = cls(**{k: v for k, v in d.items() if k in names})
        for key, value in d.items():
            if key not in names:
                setattr(sample, key, value)
        return sample


# to_dict's JSON forms of a sample's images (PNG data URLs) and image tensors ({TENSOR_KEY: nested lists, "dtype"}):
# a checkpoint's buffer state is JSON and may hold partly generated image samples.
_PNG_URL = "data:image/png;base64,"
TENSOR_KEY = "__tensor__"


def _encode_images(inputs: dict[str, Any] | None) -> dict[str, Any] | None:
    if not inputs or not inputs.get("images"):
        return inputs
    import base64
    import io

    urls = []
    for image in inputs["images"]:
        if hasattr(image, "save"):  # a PIL image
            buffer = io.BytesIO()
            image.save(buffer, format="PNG")
            image = _PNG_URL + base64.b64encode(buffer.getvalue()).decode("ascii")
        urls.append(image)
    return {**inputs, "images": urls}


def _decode_images(inputs: dict[str, Any] | None) -> dict[str, Any] | None:
    if not inputs or not inputs.get("images"):
        return inputs
    import base64
    import io

    from PIL import Image

    decoded = [
        Image.open(io.BytesIO(base64.b64decode(i[len(_PNG_URL) :]))).convert("RGB")
        if isinstance(i, str) and i.startswith(_PNG_URL)
        else i
        for i in inputs["images"]
    ]
    return {**inputs, "images": decoded}


def _encode_tensors(inputs: dict[str, Any] | None) -> dict[str, Any] | None:
    if not inputs:
        return inputs
    return {
        k: {TENSOR_KEY: v.tolist(), "dtype": str(v.dtype).removeprefix("torch.")} if hasattr(v, "dtype") else v
        for k, v in inputs.items()
    }


def _decode_tensors(inputs: dict[str, Any] | None) -> dict[str, Any] | None:
    if not inputs or not any(isinstance(v, dict) and TENSOR_KEY in v for v in inputs.values()):
        return inputs
    import torch

    return {
        k: torch.tensor(v[TENSOR_KEY], dtype=getattr(torch, v["dtype"]))
        if isinstance(v, dict) and TENSOR_KEY in v
        else v
        for k, v in inputs.items()
    }


# The Sample class new samples are made of: ours, or a subclass the plugin loader chose (slime's, for slime plugins).
_sample_type: type[Sample] = Sample


def use_sample_type(cls: type[Sample]) -> None:
    """Make `new_sample` (and `sample_type().from_dict`) build `cls`, a Sample subclass, from now on."""
    global _sample_type
    if not issubclass(cls, Sample):
        raise TypeError(f"{cls!r} is not a Sample subclass")
    _sample_type = cls


def sample_type() -> type[Sample]:
    """The Sample class new samples are made of (`use_sample_type`)."""
    return _sample_type


def new_sample(**values: Any) -> Sample:
    """A new sample of the class in use: every sample the rollout serves is made here."""
    return _sample_type(**values)


def scalar_reward(sample: Sample, reward_key: str | None = None) -> float:
    """The sample's reward as a float (dict rewards are read at `reward_key`)."""
    reward = sample.reward
    if isinstance(reward, dict):
        if reward_key is None:
            raise ValueError(f"sample {sample.index} has a dict reward {sorted(reward)}: set --reward-key")
        reward = reward[reward_key]
    return float(reward or 0.0)
