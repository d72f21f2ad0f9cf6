"""slime.rollout.data_source: slime's data-source classes over our prompt dataset (buffer/data_source.py).

A `--data-source-path` class that follows slime's contract is built as `cls(args)` and asked for
`get_samples(n)`; its `state_dict()`/`load_state_dict()` (these classes have them) go into our checkpoints,
its `save`/`load` files are not used.
"""

from __future__ import annotations

import abc
import json
from pathlib import Path
from typing import Any

from slime.utils.misc import load_function
from slime.utils.processing_utils import load_tokenizer
from slime.utils.types import Sample

from buffer.data_source import DataSource as PromptSource
from rollout.manager import load_dataset


class DataSource(abc.ABC):
    """slime's data-source interface."""

    @abc.abstractmethod
    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        """The next `num_samples` groups."""

    @abc.abstractmethod
    def add_samples(self, samples: list[list[Sample]]) -> None:
        """Take groups back."""

    @abc.abstractmethod
    def save(self, rollout_id: int) -> None:
        """Write the position to disk."""

    @abc.abstractmethod
    def load(self, rollout_id: int | None = None) -> None:
        """Read the position from disk."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Prompts in the dataset."""


class RolloutDataSource(DataSource):
    """Groups from --prompt-data (our keys and shuffling flags); read-only."""

    def __init__(self, args: Any) -> None:
        self.args = args
        self.metadata: dict[str, Any] = {}
        self.dataset = None
        self.source: PromptSource | None = None
        if getattr(args, "rollout_global_dataset", True) and args.prompt_data:  # as slime: the flag reads none
            self.dataset = load_dataset(args, args.prompt_data, load_tokenizer(args.hf_checkpoint))
            self.source = PromptSource(
                self.dataset, args.n_samples_per_prompt, shuffle=args.rollout_shuffle, seed=args.rollout_seed
            )

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        """The next `num_samples` prompts, each as a group of --n-samples-per-prompt samples."""
        if self.source is None:
            return [[Sample() for _ in range(self.args.n_samples_per_prompt)] for _ in range(num_samples)]
        return self.source.get_groups(num_samples)

    def add_samples(self, samples: list[list[Sample]]) -> None:
        """A plain dataset takes nothing back."""
        raise RuntimeError(f"{type(self).__name__} is read-only: use RolloutDataSourceWithBuffer")

    def state_dict(self) -> dict[str, Any]:
        """Position in the data (saved with our checkpoints)."""
        return {"source": self.source.state_dict() if self.source else {}, "metadata": self.metadata}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict`."""
        if self.source is not None and state.get("source"):
            self.source.load_state_dict(state["source"])
        self.metadata = dict(state.get("metadata", {}))

    def _path(self, root: str, rollout_id: int) -> Path:
        return Path(root) / "rollout" / f"global_dataset_state_dict_{rollout_id}.json"

    def save(self, rollout_id: int) -> None:
        """Write `state_dict` under --save (as JSON, not slime's .pt)."""
        if getattr(self.args, "save", None):
            path = self._path(self.args.save, rollout_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.state_dict()))

    def load(self, rollout_id: int | None = None) -> None:
        """Read what `save` wrote under --load, when there is such a file."""
        root = getattr(self.args, "load", None)
        if root and rollout_id is not None and self._path(root, rollout_id).exists():
            self.load_state_dict(json.loads(self._path(root, rollout_id).read_text()))

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """Keep plugin metadata."""
        self.metadata.update(metadata)

    def get_metadata(self) -> dict[str, Any]:
        """What `update_metadata` kept."""
        return self.metadata

    def __len__(self) -> int:
        return len(self.dataset) if self.dataset is not None else 0


def pop_first(args: Any, rollout_id: int | None, buffer: list[list[Sample]], num_samples: int) -> list[list[Sample]]:
    """slime's default buffer filter: take (and remove) the oldest `num_samples` groups."""
    chosen = buffer[:num_samples]
    del buffer[:num_samples]
    return chosen


class RolloutDataSourceWithBuffer(RolloutDataSource):
    """Returned groups first (chosen by --buffer-filter-path, else oldest first), then fresh prompts."""

    def __init__(self, args: Any) -> None:
        super().__init__(args)
        self.buffer: list[list[Sample]] = []
        path = getattr(args, "buffer_filter_path", None)
        self.buffer_filter = load_function(path) if path else pop_first

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        """Groups from the buffer, topped up from the dataset."""
        out = self.buffer_filter(self.args, None, self.buffer, num_samples) if self.buffer and num_samples > 0 else []
        return list(out) + (super().get_samples(num_samples - len(out)) if num_samples > len(out) else [])

    def add_samples(self, samples: list[list[Sample]]) -> None:
        """Keep groups to be served again."""
        self.buffer.extend(samples)

    def get_buffer_length(self) -> int:
        """Groups waiting in the buffer."""
        return len(self.buffer)
