"""The names of the built-in rewards (--rm-type, an eval dataset's or a sample's rm_type): no imports, so argument
parsing, eval configs and the reward functions share them without an import cycle."""

from __future__ import annotations

# Built-in reward types of --rm-type (rollout/rewards.py maps each name to its scorer).
RM_TYPES = (
    "math", "exact", "math_verify", "dapo", "deepscaler", "f1", "reasoning_gym", "remote", "gpqa", "random",
    "boxed_math", "boxed_exact", "boxed_f1", "boxed_gpqa",
)  # fmt: skip
# slime's names for ours.
RM_TYPE_ALIASES = {"remote_rm": "remote"}
# slime's rm_types that cannot score here, with why (an error at start, for --rm-type as for an eval dataset).
REFUSED_RM_TYPES = {
    "ifbench": "slime's ifbench scorer runs AllenAI's IFBench instruction checkers, which are not on PyPI (slime "
    "git-clones github.com/allenai/IFBench at run time) and whose requirements pin numpy==1.26.4 and spacy==3.7.4 "
    "against this engine's numpy 2; score such a dataset with custom_rm_path (--custom-rm-path) instead",
}
