"""slime.utils.misc: load_function, SingletonMeta and small helpers."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Hashable, Iterable
from typing import Any


@functools.cache
def load_function(path: str) -> Any:
    """The attribute named by `package.module.attr` (cached per path; ImportError/AttributeError as slime)."""
    module_path, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module_path), attr)


class SingletonMeta(type):
    """One instance per class: later calls return it and ignore their arguments."""

    _instances: dict[type, Any] = {}  # noqa: RUF012 (shared on purpose, as in slime)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls not in SingletonMeta._instances:
            SingletonMeta._instances[cls] = super().__call__(*args, **kwargs)
        return SingletonMeta._instances[cls]

    @staticmethod
    def clear_instances(cls: type | None = None) -> None:
        """Forget the instance of `cls` (of every class when None)."""
        if cls is None:
            SingletonMeta._instances.clear()
        else:
            SingletonMeta._instances.pop(cls, None)


class Box:
    """A mutable holder for one value."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    @property
    def inner(self) -> Any:
        """The value held."""
        return self._inner


def group_by(iterable: Iterable[Any], key: Callable[[Any], Hashable] | None = None) -> dict[Hashable, list[Any]]:
    """Items by key (the item itself without a key), in first-seen order."""
    out: dict[Hashable, list[Any]] = {}
    for item in iterable:
        out.setdefault(item if key is None else key(item), []).append(item)
    return out


def should_run_periodic_action(
    rollout_id: int, interval: int | None, num_rollout_per_epoch: int | None = None, num_rollout: int | None = None
) -> bool:
    """True every `interval` rollouts, at the end of an epoch and at the last rollout."""
    if interval is None:
        return False
    step = rollout_id + 1
    if num_rollout is not None and step == num_rollout:
        return True
    if num_rollout_per_epoch and step % num_rollout_per_epoch == 0:
        return True
    return step % interval == 0
