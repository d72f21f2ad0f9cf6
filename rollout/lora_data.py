"""The prompt source of a multi-LoRA run (--multi-lora-adapter): one data source per adapter, groups drawn from the
adapters in turn, each sample tagged with its adapter's name (metadata['lora_adapter']), which its /generate
requests name (rollout/generate.py) and the trainer trains on (slime_like/trainer/actor.py)."""

from __future__ import annotations

import copy
from typing import Any

from rollout.sglang_client import LORA_ADAPTER_KEY as ADAPTER_KEY
from slime_like.core.sample import Sample


class MultiLoraSource:
    """Serves groups from the adapters' sources in turn (group k from adapter k mod N, across calls); resumable."""

    def __init__(self, sources: dict[str, Any]) -> None:
        self.sources = sources
        self.names = list(sources)
        self.turn = 0  # the adapter the next group comes from

    def get_groups(self, num_groups: int) -> list[list[Sample]]:
        """The next `num_groups` groups, each from the adapter whose turn it is, its samples tagged with its name."""
        groups = []
        for _ in range(num_groups):
            name = self.names[self.turn % len(self.names)]
            self.turn += 1
            (group,) = self.sources[name].get_groups(1)
            for sample in group:
                sample.metadata[ADAPTER_KEY] = name
            groups.append(group)
        return groups

    def state_dict(self) -> dict[str, Any]:
        """Each adapter's source position and whose turn is next."""
        return {"turn": self.turn, "sources": {name: s.state_dict() for name, s in self.sources.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict`."""
        self.turn = state["turn"]
        for name, source_state in state["sources"].items():
            self.sources[name].load_state_dict(source_state)


def multi_lora_source(args: Any, tokenizer: Any) -> MultiLoraSource:
    """The --data-source-path factory a multi-LoRA run uses: each adapter's `data` file, read with the data flags
    and the adapter's own input_key/label_key where its config gives them."""
    from buffer.data_source import DataSource
    from rollout.manager import load_dataset

    sources = {}
    for i, name in enumerate(args.lora_adapter_names):
        config = args.multi_lora_configs[name]
        own = copy.copy(args)
        for key in ("input_key", "label_key"):
            if key in config:
                setattr(own, key, config[key])
        dataset = load_dataset(own, config["data"], tokenizer)
        seed = args.rollout_seed + 1000 * i  # each adapter shuffles its prompts on its own
        sources[name] = DataSource(dataset, args.n_samples_per_prompt, shuffle=args.rollout_shuffle, seed=seed)
    return MultiLoraSource(sources)
