"""Prompt data source: jsonl/parquet rows -> groups of Samples, epoch-wise shuffled, resumable."""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slime_like.core.sample import Sample, new_sample

logger = logging.getLogger(__name__)


class DataError(ValueError):
    """A data row or file that cannot be used, with the file and line in the message."""


@dataclass
class Prompt:
    """One usable data row: the prompt as given to the model, its label and metadata."""

    prompt: str | list[dict[str, Any]]
    label: Any
    metadata: dict[str, Any]
    prompt_tokens: int | None = None
    images: list[Any] | None = None  # decoded RGB images of a --multimodal-keys row (buffer/multimodal.py)


def _read_rows(path: Path) -> list[tuple[int, str | dict]]:
    """(line number, raw row) pairs; jsonl rows stay unparsed so a bad row is reported by line."""
    if not path.exists():
        raise DataError(f"prompt data file {path} does not exist (check --prompt-data)")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [(i + 1, row) for i, row in enumerate(pq.read_table(path).to_pylist())]
    if path.suffix not in (".jsonl", ".json"):
        raise DataError(f"prompt data file {path}: expected .jsonl or .parquet")
    with path.open(encoding="utf-8") as f:
        return [(i + 1, line) for i, line in enumerate(f) if line.strip()]


class PromptDataset:
    """All usable rows of one file, parsed and checked once, with counts of what was skipped and why."""

    def __init__(
        self,
        path: str | Path,
        *,
        input_key: str = "prompt",
        label_key: str | None = "label",
        metadata_key: str | None = "metadata",
        tool_key: str | None = None,
        tokenizer: Any = None,
        apply_chat_template: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
        max_prompt_len: int | None = None,
        skip_bad_rows: bool = False,
        multimodal_keys: dict[str, str] | None = None,
        processor: Any = None,
    ) -> None:
        self.path = Path(path)
        self.multimodal_keys = multimodal_keys
        self.processor = processor
        if multimodal_keys and processor is None:
            raise DataError("--multimodal-keys needs the checkpoint's processor (set --hf-checkpoint)")
        self.skipped: Counter[str] = Counter()
        self.prompts: list[Prompt] = []
        for line_no, raw in _read_rows(self.path):
            try:
                prompt = self._parse(raw, line_no, input_key, label_key, metadata_key, tool_key)
                if multimodal_keys:
                    self._read_images(prompt, raw, line_no, apply_chat_template, chat_template_kwargs)
            except DataError as exc:
                if not skip_bad_rows:
                    raise DataError(f"{exc} (pass --skip-bad-rows to skip such rows and count them)") from None
                logger.warning("skipping %s", exc)
                self.skipped["bad_row"] += 1
                continue
            if prompt.images is not None:
                if max_prompt_len is not None and prompt.prompt_tokens > max_prompt_len:
                    self.skipped["prompt_too_long"] += 1
                    continue
            elif apply_chat_template:
                if tokenizer is None:
                    raise DataError("--apply-chat-template needs a tokenizer (set --hf-checkpoint)")
                messages = prompt.prompt
                if isinstance(messages, str):
                    messages = [{"role": "user", "content": messages}]
                tools = prompt.metadata.get("tools") if tool_key else None
                prompt.prompt = tokenizer.apply_chat_template(
                    messages, tools=tools, tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {})
                )
            if prompt.images is None and tokenizer is not None and isinstance(prompt.prompt, str):
                prompt.prompt_tokens = len(tokenizer(prompt.prompt, add_special_tokens=False)["input_ids"])
                if max_prompt_len is not None and prompt.prompt_tokens > max_prompt_len:
                    self.skipped["prompt_too_long"] += 1
                    continue
            self.prompts.append(prompt)
        if self.skipped:
            logger.warning("%s: skipped rows %s", self.path, dict(self.skipped))
        if not self.prompts:
            raise DataError(f"{self.path}: no usable rows (skipped: {dict(self.skipped)})")

    def _parse(
        self,
        raw: str | dict,
        line_no: int,
        input_key: str,
        label_key: str | None,
        metadata_key: str | None,
        tool_key: str | None = None,
    ) -> Prompt:
        where = f"{self.path}:{line_no}"
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(raw, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(raw).__name__}")
        if input_key not in raw:
            raise DataError(f"{where}: no key {input_key!r} (--input-key); keys are {sorted(raw)}")
        if label_key and label_key not in raw:
            raise DataError(f"{where}: no key {label_key!r} (--label-key); keys are {sorted(raw)}")
        metadata = raw.get(metadata_key) if metadata_key else None
        if isinstance(metadata, str):
            metadata = json.loads(metadata)
        metadata = dict(metadata or {})
        if tool_key and raw.get(tool_key) is not None:  # slime: tools go to metadata["tools"] as a list
            tools = raw[tool_key]
            try:
                tools = json.loads(tools) if isinstance(tools, str) else list(tools)
            except (json.JSONDecodeError, TypeError):
                tools = None
            if not isinstance(tools, list):
                raise DataError(f"{where}: {tool_key!r} (--tool-key) must be a list of tools or JSON of one")
            metadata["tools"] = tools
        return Prompt(raw[input_key], raw.get(label_key) if label_key else None, metadata)

    def _read_images(
        self, prompt: Prompt, raw: str | dict, line_no: int, apply_chat_template: bool, template_kwargs: dict | None
    ) -> None:
        """A --multimodal-keys row: its images decoded, its prompt as chat messages with image parts (rendered to
        text with --apply-chat-template, as slime), its token count from the processor (image tokens included)."""
        from buffer import multimodal as mm

        row = json.loads(raw) if isinstance(raw, str) else raw
        try:
            images = mm.row_images(row, self.multimodal_keys["image"], self.path.parent)
            messages = mm.build_messages(prompt.prompt, images)
            text = mm.render_text(self.processor, messages, template_kwargs)
            ids, _ = mm.process(self.processor, text, images)
        except (ValueError, OSError) as exc:  # ImageError, or the processor refusing an image (e.g. its shape)
            raise DataError(f"{self.path}:{line_no}: {exc}") from None
        prompt.prompt = text if apply_chat_template else messages
        prompt.images = images
        prompt.prompt_tokens = len(ids)

    def __len__(self) -> int:
        return len(self.prompts)


class DataSource:
    """Serves groups of `n_samples_per_prompt` Samples, reshuffling each epoch; its state resumes a run."""

    def __init__(
        self, dataset: PromptDataset, n_samples_per_prompt: int, *, shuffle: bool = True, seed: int = 0
    ) -> None:
        self.dataset = dataset
        self.n_samples_per_prompt = n_samples_per_prompt
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.offset = 0  # position inside this epoch's order
        self.next_group_index = 0
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def get_groups(self, num_groups: int) -> list[list[Sample]]:
        """The next `num_groups` prompts, each expanded into a group of Samples."""
        groups = []
        for _ in range(num_groups):
            if self.offset >= len(self._order):
                self.epoch += 1
                self.offset = 0
                self._order = self._epoch_order(self.epoch)
            prompt = self.dataset.prompts[self._order[self.offset]]
            self.offset += 1
            groups.append(self._make_group(prompt))
        return groups

    def _make_group(self, prompt: Prompt) -> list[Sample]:
        group_index = self.next_group_index
        self.next_group_index += 1
        return [
            new_sample(
                prompt=prompt.prompt,
                label=prompt.label,
                metadata=dict(prompt.metadata),
                group_index=group_index,
                index=group_index * self.n_samples_per_prompt + i,
                **({"multimodal_inputs": {"images": list(prompt.images)}} if prompt.images is not None else {}),
            )
            for i in range(self.n_samples_per_prompt)
        ]

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must keep to continue with the next unseen prompt."""
        return {
            "epoch": self.epoch,
            "offset": self.offset,
            "next_group_index": self.next_group_index,
            "seed": self.seed,
        }

    @staticmethod
    def state_from_slime(slime_state: dict[str, Any], seed: int) -> dict[str, Any]:
        """Our state_dict from slime's saved data position (its RolloutDataSource.save), for the same prompt file
        and --rollout-seed: both sources order an epoch as random.Random(seed + epoch) shuffles it (or the file's
        order) and count groups the same way, so the next prompt is the one slime would have taken."""
        return {
            "epoch": int(slime_state.get("epoch_id", 0)),
            "offset": int(slime_state.get("sample_offset", 0)),
            "next_group_index": int(slime_state.get("sample_group_index", 0)),
            "seed": seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict`."""
        self.seed = state["seed"]
        self.epoch = state["epoch"]
        self.offset = state["offset"]
        self.next_group_index = state["next_group_index"]
        self._order = self._epoch_order(self.epoch)


class EmptySource:
    """slime's --disable-rollout-global-dataset: no prompt dataset; groups of empty Samples for a rollout function
    that supplies its own data (slime's RolloutDataSource without a dataset)."""

    dataset = None  # slime's data source reports len() 0 then

    def __init__(self, n_samples_per_prompt: int) -> None:
        self.n_samples_per_prompt = n_samples_per_prompt
        self.next_group_index = 0

    def get_groups(self, num_groups: int) -> list[list[Sample]]:
        """`num_groups` groups of empty Samples, numbered on from the last (group and sample indices)."""
        first = self.next_group_index
        self.next_group_index += num_groups
        n = self.n_samples_per_prompt
        return [
            [new_sample(group_index=g, index=g * n + i) for i in range(n)] for g in range(first, first + num_groups)
        ]

    def state_dict(self) -> dict[str, Any]:
        """The group counter (slime saves nothing for this source; resuming keeps indices unique here)."""
        return {"next_group_index": self.next_group_index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict` (or from a --prompt-data source's state: its group counter)."""
        self.next_group_index = int(state.get("next_group_index", 0))

    def __len__(self) -> int:
        return 0


def empty_source(args: Any, tokenizer: Any = None) -> EmptySource:
    """The data source of a run with --disable-rollout-global-dataset (a --data-source-path factory's signature)."""
    return EmptySource(args.n_samples_per_prompt)
