"""Several LoRA adapters over one frozen base in one trainer (--multi-lora-adapter): one adapter set per name.

The engine holds one live adapter (lora.py). Each other adapter's weights, Adam state (moments and step count)
and learning-rate schedule position wait here; `activate(name)` swaps them in. So an adapter's step moves only its
own weights and optimizer state, and the same steps give the same adapter as a run that trains it alone. A rollout
that mixes adapters trains each on its own samples, one after another (buffer/lora_share.py), with the loss
normalised over that adapter's samples of each step. Swapping copies only adapter-sized tensors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from buffer.lora_share import adapter_names, adapter_share
from buffer.train_data import RankShare
from slime_like.trainer.megatron.lora import is_adapter_param

logger = logging.getLogger(__name__)
SEPARATOR = "/"  # between an adapter's name and its PEFT keys in a multi-adapter export (names hold no '/')


class AdapterSlots:
    """One adapter (weights, optimizer state, schedule position) per name over the engine's frozen base."""

    def __init__(self, engine: Any, names: list[str]) -> None:
        if engine.lora is None:
            raise ValueError("AdapterSlots needs an engine built with LoRA (--lora-rank)")
        self.engine = engine
        self.names = list(names)
        self.active = self.names[0]
        start = self._capture()
        self.saved = {name: start for name in self.names[1:]}  # copied on restore: one start serves them all
        self.changed = set(self.names)  # adapters the servers do not hold yet at their current version

    def _params(self) -> list[torch.Tensor]:
        return [p for m in self.engine.model for n, p in m.named_parameters() if is_adapter_param(n)]

    def _optimizer_params(self) -> list[tuple[Any, torch.Tensor]]:
        """(torch optimizer, parameter it updates) pairs: the adapters' (fp32 main copies, or shards) only."""
        optimizer = self.engine.optimizer
        inner = [o.optimizer for o in getattr(optimizer, "chained_optimizers", [optimizer])]
        return [(o, p) for o in inner for group in o.param_groups for p in group["params"]]

    def _capture(self) -> dict[str, Any]:
        """A copy of the live adapter's weights, optimizer parameters and state, and schedule position."""
        pairs = self._optimizer_params()
        with torch.no_grad():
            return {
                "params": [p.detach().clone() for p in self._params()],
                "main": [p.detach().clone() for _, p in pairs],
                "state": [{k: v.clone() if torch.is_tensor(v) else v for k, v in o.state[p].items()} for o, p in pairs],
                "steps": self.engine.scheduler.num_steps,
            }

    def _restore(self, saved: dict[str, Any]) -> None:
        pairs = self._optimizer_params()
        with torch.no_grad():
            for param, value in zip(self._params(), saved["params"], strict=True):
                param.copy_(value)
            for (optimizer, param), value, state in zip(pairs, saved["main"], saved["state"], strict=True):
                param.copy_(value)
                optimizer.state.pop(param, None)
                if state:
                    optimizer.state[param] = {k: v.clone() if torch.is_tensor(v) else v for k, v in state.items()}
        self.engine.scheduler.num_steps = saved["steps"]
        self.engine.scheduler.step(0)  # the learning rate of that position

    def activate(self, name: str) -> None:
        """Make adapter `name` the live one (the others' weights and optimizer state are kept aside)."""
        if name not in self.names:
            raise KeyError(f"no adapter {name!r}; this run trains {', '.join(self.names)}")
        if name != self.active:
            self.saved[self.active] = self._capture()
            self._restore(self.saved.pop(name))
            self.active = name

    def train_each(self, share: RankShare, train: Callable[[RankShare], dict[str, float]]) -> dict[str, float]:
        """Train each adapter named in the rollout on its own samples (`train` takes the adapter's share); metrics
        come back per adapter (`train/<name>/loss`), times summed."""
        names = adapter_names(share)
        untagged = sum(a is None for a in share.rollout.lora_adapters) if names else len(share.rollout)
        if untagged:
            raise ValueError(
                f"multi-LoRA: {untagged} of {len(share.rollout)} samples name no adapter (metadata['lora_adapter']): "
                "a custom data source or generate function must keep the tag rollout/lora_data.py sets"
            )
        unknown = [n for n in names if n not in self.names]
        if unknown:
            raise ValueError(f"multi-LoRA: samples name adapters {unknown} this run does not train ({self.names})")
        metrics: dict[str, float] = {}
        for name in names:
            part = adapter_share(share, name)
            if not part.step_bounds:
                continue
            self.activate(name)
            for key, value in train(part).items():
                group, _, rest = key.partition("/")
                if group == "time":
                    metrics[key] = metrics.get(key, 0.0) + value
                else:
                    metrics[f"{group}/{name}/{rest}" if rest else f"{key}/{name}"] = value
            self.changed.add(name)
        return metrics

    def export(self, names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        """(`<name>/<PEFT key>`, tensor) of each named adapter (a collective, as engine.export_adapter)."""
        for name in names:
            self.activate(name)
            for key, tensor in self.engine.export_adapter():  # a copy: the next activate overwrites the live adapter
                yield f"{name}{SEPARATOR}{key}", tensor.clone()

    def save(self, directory: str | Path) -> None:
        """Write every adapter in PEFT format under `<directory>/<name>/` (a collective; rank 0 writes)."""
        for name in self.names:
            self.activate(name)
            self.engine.save_adapter(Path(directory) / name)


def adapter_slots(engine: Any, args: Any) -> AdapterSlots | None:
    """The adapter set of a multi-LoRA run (--multi-lora-adapter), each started from its config's adapter_path
    when given; None in other runs."""
    names = getattr(args, "lora_adapter_names", None)
    if not names:
        return None
    slots = AdapterSlots(engine, names)
    for name in names:
        start = args.multi_lora_configs[name].get("adapter_path")
        if start:
            slots.activate(name)
            engine.load_adapter(start)
            slots.changed.add(name)
    logger.info("multi-LoRA: %d adapters over one base: %s", len(names), ", ".join(names))
    return slots
