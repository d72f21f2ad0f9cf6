"""Example --data-source-path: endless reasoning-gym problems instead of a prompt file.

    --data-source-path plugins.data_sources.ReasoningGymSource --rm-type reasoning_gym

Problem i of task t is generated from the seed (--rollout-seed) and i, so the state is one counter and a
resumed run continues with the next unseen problem.
"""

from __future__ import annotations

from typing import Any

from slime_like.core.sample import Sample, new_sample

TASKS = ("basic_arithmetic", "chain_sum")
INSTRUCTION = "\nGive the final answer as <answer>...</answer>."


class ReasoningGymSource:
    """Groups of `--n-samples-per-prompt` Samples over reasoning-gym problems, tasks taken in turn."""

    def __init__(self, args: Any, tokenizer: Any) -> None:
        import reasoning_gym

        self.n = args.n_samples_per_prompt
        self.datasets = [reasoning_gym.create_dataset(t, size=10**9, seed=args.rollout_seed) for t in TASKS]
        self.next_group_index = 0

    def get_groups(self, num_groups: int) -> list[list[Sample]]:
        """The next `num_groups` problems, each as a group of samples."""
        groups = []
        for _ in range(num_groups):
            g = self.next_group_index
            self.next_group_index += 1
            entry = self.datasets[g % len(self.datasets)][g // len(self.datasets)]
            groups.append(
                [
                    new_sample(
                        prompt=entry["question"] + INSTRUCTION,
                        label=entry["answer"],
                        metadata={**entry["metadata"], "question": entry["question"]},
                        group_index=g,
                        index=g * self.n + i,
                    )
                    for i in range(self.n)
                ]
            )
        return groups

    def state_dict(self) -> dict[str, Any]:
        """The next problem to serve."""
        return {"next_group_index": self.next_group_index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from `state_dict`."""
        self.next_group_index = state["next_group_index"]
