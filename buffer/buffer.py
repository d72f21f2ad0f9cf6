"""The rollout buffer: groups handed back (partial or aborted) are served before fresh prompts."""

from __future__ import annotations

from collections import deque
from typing import Any

from buffer.data_source import DataSource
from slime_like.sample import Sample


class Buffer:
    """A FIFO of returned groups in front of a DataSource."""

    def __init__(self, source: DataSource) -> None:
        self.source = source
        self._returned: deque[list[Sample]] = deque()

    def __len__(self) -> int:
        return len(self._returned)

    def add_groups(self, groups: list[list[Sample]]) -> None:
        """Hand groups back to be served again (e.g. aborted or partially generated)."""
        self._returned.extend(groups)

    def get_groups(self, num_groups: int) -> list[list[Sample]]:
        """Returned groups first, then fresh ones from the data source."""
        out = []
        while self._returned and len(out) < num_groups:
            out.append(self._returned.popleft())
        if len(out) < num_groups:
            out.extend(self.source.get_groups(num_groups - len(out)))
        return out

    def state_dict(self) -> dict[str, Any]:
        """Data source position plus the groups still waiting in the buffer."""
        return {
            "source": self.source.state_dict(),
            "returned": [[s.to_dict() for s in g] for g in self._returned],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict`."""
        self.source.load_state_dict(state["source"])
        self._returned = deque([Sample.from_dict(s) for s in g] for g in state["returned"])
