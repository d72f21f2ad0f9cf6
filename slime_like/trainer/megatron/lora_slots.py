"""Several LoRA adapters over one frozen base in one trainer (--multi-lora-adapter): one adapter set per name.

The engine holds one live adapter (lora.py). Each other adapter's weights, Adam state (moments and step count)
and learning-rate schedule position wait here; `activate(name)` swaps them in. So an adapter's step moves only its
own weights and optimizer state, and the same steps give the same adapter as a run that trains it alone. A rollout
that mixes adapters trains each on its own samples, one after another (buffer/lora_share.py), with the loss
normalised over that adapter's samples of each step. Swapping copies only adapter-sized tensors.

A checkpoint (`save`) holds each adapter twice: in PEFT format under `lora/<name>/` (to serve or to start another
run from), and under `lora_state/<name>/` as a torch_dist checkpoint of the adapter's tensors alone with its
optimizer state and schedule position, which `load` restores (--load). That part has the layout rules of the
engine's own checkpoint (checkpoint.py): any DP size, the saved TP size.
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
PEFT_DIR = "lora"  # in a checkpoint: each adapter in PEFT format, <checkpoint>/lora/<name>/
STATE_DIR = "lora_state"  # in a checkpoint: each adapter's tensors and optimizer state, <checkpoint>/lora_state/<name>/


class AdapterSlots:
    """One adapter (weights, optimizer state, schedule position) per name over the engine's frozen base."""

    def __init__(self, engine: Any, names: list[str]) -> None:
        if engine.lora is None:
            raise ValueError("AdapterSlots needs an engine built with LoRA (--lora-rank)")
        from slime_like.trainer.megatron.offload import materialize_optimizer_state

        self.engine = engine
        self.names = list(names)
        self.active = self.names[0]
        if engine.optimizer is not None:  # Adam's zero state, as its first step would make it: every adapter has
            materialize_optimizer_state(engine.optimizer)  # one, so a checkpoint of one not trained yet has too
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

    def save(self, checkpoint: str | Path) -> None:
        """Write every adapter into a checkpoint directory (a collective): in PEFT format under `lora/<name>/`
        (rank 0 writes) and, to resume from, its tensors, optimizer state and schedule position under
        `lora_state/<name>/` (torch_dist, the adapter's tensors only: the frozen base is in the engine's checkpoint)."""
        from slime_like.trainer.megatron.checkpoint import save_checkpoint

        live, engine = self.active, self.engine
        for name in self.names:
            self.activate(name)
            engine.save_adapter(Path(checkpoint) / PEFT_DIR / name)
            target = Path(checkpoint) / STATE_DIR / name
            save_checkpoint(target, engine.model, engine.optimizer, engine.scheduler, rng=False, only=is_adapter_param)
        self.activate(live)

    def load(self, checkpoint: str | Path, load_optimizer: bool = True) -> None:
        """Restore every adapter this run trains from a checkpoint `save` wrote (a collective): its weights and,
        with load_optimizer, its Adam state and schedule position (else those start fresh). Adapters the checkpoint
        holds and this run does not train are left out (a log line names them); one it lacks stops the load."""
        from slime_like.trainer.megatron.checkpoint import load_checkpoint

        directory = Path(checkpoint) / STATE_DIR
        held = sorted(p.name for p in directory.iterdir() if p.is_dir()) if directory.is_dir() else []
        if not held:
            raise ValueError(
                f"{checkpoint} holds no multi-LoRA adapter states ({STATE_DIR}/<name>/): it was not saved by a "
                "multi-LoRA run (--multi-lora-adapter). Start each adapter from a PEFT adapter instead (adapter_path "
                "in its config) and drop --load"
            )
        missing = [name for name in self.names if name not in held]
        if missing:
            raise ValueError(
                f"{checkpoint} holds the adapters {', '.join(held)}, not {', '.join(missing)}: resume with the "
                "adapters it holds, or start a new adapter in another run (adapter_path starts one from a saved one)"
            )
        dropped = [name for name in held if name not in self.names]
        if dropped:
            logger.info("%s: adapters %s are not trained in this run, not loaded", checkpoint, ", ".join(dropped))
        live, engine = self.active, self.engine
        for name in self.names:
            self.activate(name)
            if engine.scheduler is not None:
                engine.scheduler.num_steps = 0  # a loaded position is added to the current one (Megatron's)
                engine.scheduler.step(0)
            load_checkpoint(
                directory / name,
                engine.model,
                engine.optimizer,
                engine.scheduler,
                load_optimizer=load_optimizer,
                load_rng=False,
                only=is_adapter_param,
            )
            self.changed.add(name)
        self.activate(live)
        logger.info("multi-LoRA: loaded adapters %s from %s", ", ".join(self.names), checkpoint)


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
