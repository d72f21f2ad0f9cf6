"""The rollout buffer: groups handed back (partial or aborted) are served before fresh prompts."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from buffer.accounting import GroupLedger
from slime_like.core.sample import Sample, sample_type

BufferFilter = Callable[[Any, list[list[Sample]], int], list[list[Sample]]]


class Buffer:
    """Returned groups in front of a data source; a buffer filter picks which returned groups run next."""

    def __init__(self, source: Any, buffer_filter: BufferFilter | None = None, args: Any = None) -> None:
        self.source = source  # anything with get_groups(n), state_dict(), load_state_dict(state)
        self.buffer_filter = buffer_filter
        self.args = args
        self._returned: deque[list[Sample]] = deque()
        self._ledger: GroupLedger | None = None  # open while a rollout draws from this buffer

    def open_ledger(self, carries: bool = False) -> GroupLedger:
        """Start recording every group drawn and handed back (one rollout, or one --fully-async step, at a time);
        `close_ledger` stops."""
        if self._ledger is not None:
            raise RuntimeError("a rollout is already recording this buffer's groups (two rollouts at once?)")
        self._ledger = GroupLedger(carries)
        return self._ledger

    def close_ledger(self) -> None:
        """Stop recording (the ledger keeps what it saw)."""
        self._ledger = None

    def __len__(self) -> int:
        return len(self._returned)

    def returned_groups(self) -> list[list[Sample]]:
        """The groups waiting in the buffer, oldest first."""
        return list(self._returned)

    def add_groups(self, groups: list[list[Sample]]) -> None:
        """Hand groups back to be served again (e.g. aborted or partially generated)."""
        self._returned.extend(groups)
        if self._ledger is not None:
            self._ledger.give_back(groups)

    def get_groups(self, num_groups: int) -> list[list[Sample]]:
        """Returned groups first (chosen by the buffer filter, else oldest first), then fresh ones from the source."""
        out = self._take_returned(num_groups)
        fresh = self.source.get_groups(num_groups - len(out)) if len(out) < num_groups else []
        if self._ledger is not None:
            self._ledger.draw(out, "buffer")
            self._ledger.draw(fresh, "source")
        return out + fresh

    def _take_returned(self, num_groups: int) -> list[list[Sample]]:
        if not self._returned:
            return []
        waiting = list(self._returned)
        if self.buffer_filter is None:
            chosen = waiting[:num_groups]
        else:
            chosen = self.buffer_filter(self.args, waiting, num_groups)
            ids = {id(g) for g in waiting}
            if (
                len(chosen) > num_groups
                or any(id(g) not in ids for g in chosen)
                or len({id(g) for g in chosen}) < len(chosen)
            ):
                raise ValueError(
                    f"--buffer-filter-path must return at most {num_groups} distinct groups taken from the list it "
                    f"was given; it returned {len(chosen)}"
                )
        taken = {id(g) for g in chosen}
        self._returned = deque(g for g in self._returned if id(g) not in taken)
        return list(chosen)

    def state_dict(self) -> dict[str, Any]:
        """Data source position plus the groups still waiting in the buffer."""
        return {
            "source": self.source.state_dict(),
            "returned": [[s.to_dict() for s in g] for g in self._returned],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict`."""
        self.source.load_state_dict(state["source"])
        self._returned = deque([sample_type().from_dict(s) for s in g] for g in state["returned"])
