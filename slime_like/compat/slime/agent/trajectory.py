"""slime's `TurnRecord`: one /generate call of an agent session (the ids sent and sampled, their log-probs)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TurnRecord:
    """One /generate snapshot: the prompt and output ids, why it stopped, the output's log-probs."""

    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str
    output_log_probs: list[float] = dataclasses.field(default_factory=list)
    ill_formed: bool = False
