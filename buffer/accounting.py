"""Per-rollout group accounting: every group a rollout draws ends up in exactly one place, and it is checked.

    drawn (from the data source + from the buffer) = trained + failed (by reason) + dropped (by reason) + returned

- drawn: groups handed out by `Buffer.get_groups` while the ledger is open (a returned group drawn again in the
  same rollout counts once).
- trained: groups in the rollout the trainer receives with at least one trainable sample (`trainable`).
- failed_<reason>: groups in the rollout with no trainable sample; they go to the trainer (and the rollout dump,
  with their errors) but teach nothing. Reason: `generate`, `reward`, `aborted`, `empty` (no response token),
  or `mixed`.
- dropped_<reason>: finished groups the dynamic sampling filter rejected (reason from the filter).
- returned: groups handed back to the buffer (aborted or beyond the batch) with `Buffer.add_groups`.

Under --fully-async a ledger covers one training step, and groups cross step boundaries: those the continuous
rollout holds (generating, or finished and not yet trained) when a step's batch is taken are `carried` out of that
step's ledger and drawn, origin `carried`, into the next one's (`GroupLedger(carries=True)`):

    drawn (source + buffer + carried in) = trained + failed + dropped + returned + carried out

A group is tracked by identity (the list object), so a group lost or counted twice is caught even where the
totals happen to agree. Counts that do not add up are a bug in the rollout loop: `check` raises AccountingError.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from buffer.train_data import trainable
from slime_like.core.sample import Sample, Status

DRAWN = "drawn"
RETURNED = "returned"
TRAINED = "trained"
CARRIED = "carried"


class AccountingError(RuntimeError):
    """A rollout's groups do not add up: a group was lost or counted twice (a bug, never the data's fault)."""


def all_failed(groups: list[list[Sample]]) -> str | None:
    """None unless every sample failed; then what failed them: the counts by reason and the commonest errors."""
    samples = [s for g in groups for s in g]
    if not samples or any(s.status != Status.FAILED for s in samples):
        return None
    errors = Counter(s.metadata.get("generate_error") or s.metadata.get("reward_error") or "?" for s in samples)
    reasons = Counter(failure_reason(g) for g in groups)
    quoted = "; ".join(f"{n} x {text[:300]}" for text, n in errors.most_common(3))
    by_reason = ", ".join(f"{n} groups by {reason}" for reason, n in reasons.most_common())
    return f"all {len(samples)} samples failed ({by_reason}): {quoted}"


def failure_reason(group: list[Sample]) -> str | None:
    """None when some sample of the group can train; else why none can (generate, reward, aborted, empty, mixed)."""
    reasons = set()
    for sample in group:
        if trainable(sample):
            return None
        if sample.status == Status.ABORTED:
            reasons.add("aborted")
        elif sample.status == Status.FAILED:
            reasons.add("reward" if "reward_error" in sample.metadata else "generate")
        else:
            reasons.add("empty")
    if len(reasons) > 1:
        return "mixed"
    return reasons.pop() if reasons else "empty"


class GroupLedger:
    """Where each group of one rollout went; `check` raises when the counts do not add up."""

    def __init__(self, carries: bool = False) -> None:
        self.carries = carries  # a --fully-async step's ledger: groups cross its boundaries (counted as carried)
        # id(group) -> state; the groups themselves are held so that no id is reused while the ledger is open.
        self._state: dict[int, str] = {}
        self._origin: dict[int, str] = {}
        self._groups: dict[int, list[Sample]] = {}
        self._problems: list[str] = []

    def draw(self, groups: list[list[Sample]], origin: str) -> None:
        """Groups handed out by the buffer; origin is `source` (fresh prompts) or `buffer` (handed back earlier)."""
        for group in groups:
            key = id(group)
            state = self._state.get(key)
            if state is not None and state != RETURNED:
                self._problems.append(f"group {_name(group)} drawn again while it was still {state}")
            self._state[key] = DRAWN
            self._origin.setdefault(key, origin)
            self._groups[key] = group

    def give_back(self, groups: list[list[Sample]]) -> None:
        """Groups handed back to the buffer."""
        for group in groups:
            self._settle(group, RETURNED)

    def drop(self, group: list[Sample], reason: str) -> None:
        """A finished group the dynamic sampling filter rejected."""
        self._settle(group, f"dropped_{reason}")

    def keep(self, groups: list[list[Sample]]) -> None:
        """The groups of the rollout the trainer receives: each is trained, or failed when no sample can train."""
        for group in groups:
            reason = failure_reason(group)
            self._settle(group, TRAINED if reason is None else f"failed_{reason}")

    def carry(self, groups: list[list[Sample]]) -> None:
        """Groups still held by the continuous rollout when the step ends: they continue in the next step."""
        for group in groups:
            self._settle(group, CARRIED)

    def _settle(self, group: list[Sample], outcome: str) -> None:
        key = id(group)
        state = self._state.get(key)
        if state is None:
            self._problems.append(f"group {_name(group)} {outcome} but never drawn in this rollout")
            self._groups[key] = group
        elif state != DRAWN:
            self._problems.append(f"group {_name(group)} {outcome} but it was already {state}")
        self._state[key] = outcome

    def counts(self) -> dict[str, int]:
        """`groups_<outcome>` counts, totals included (reported as `rollout/groups_*`)."""
        origins = Counter(self._origin[k] for k in self._state if k in self._origin)
        outcomes = Counter(self._state.values())
        out = {
            "groups_drawn": sum(origins.values()),
            "groups_drawn_source": origins["source"],
            "groups_drawn_buffer": origins["buffer"],
            "groups_trained": outcomes[TRAINED],
            "groups_returned": outcomes[RETURNED],
        }
        if self.carries:
            out["groups_drawn_carried"] = origins[CARRIED]
            out["groups_carried"] = outcomes[CARRIED]
        for kind in ("failed", "dropped"):
            detail = {k: n for k, n in outcomes.items() if k.startswith(f"{kind}_")}
            out[f"groups_{kind}"] = sum(detail.values())
            out.update({f"groups_{k}": n for k, n in sorted(detail.items())})
        if outcomes[DRAWN]:
            out["groups_unaccounted"] = outcomes[DRAWN]
        return out

    def check(self) -> dict[str, int]:
        """The counts, after checking drawn = trained + failed + dropped + returned (+ carried) with every group
        once."""
        counts = self.counts()
        settled = sum(counts.get(f"groups_{k}", 0) for k in ("trained", "failed", "dropped", "returned", CARRIED))
        missing = [_name(self._groups[k]) for k, state in self._state.items() if state == DRAWN]
        if settled != counts["groups_drawn"] or missing or self._problems:
            detail = "; ".join(self._problems + ([f"never settled: {', '.join(missing)}"] if missing else []))
            raise AccountingError(
                f"rollout group accounting does not add up: drawn {counts['groups_drawn']} "
                f"(source {counts['groups_drawn_source']}, buffer {counts['groups_drawn_buffer']}) != trained "
                f"{counts['groups_trained']} + failed {counts['groups_failed']} + dropped {counts['groups_dropped']}"
                f" + returned {counts['groups_returned']} + carried {counts.get('groups_carried', 0)} "
                f"({detail or 'counts differ'}); this is a bug in the rollout loop, please report it"
            )
        return counts


def _name(group: list[Sample]) -> str:
    """A group as the error names it: its group index, else its first sample index."""
    first: Any = group[0] if group else None
    if first is None:
        return "<empty>"
    return f"#{first.group_index}" if first.group_index is not None else f"(sample {first.index})"
