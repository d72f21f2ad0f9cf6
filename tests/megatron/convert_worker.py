"""torchrun worker: run the checkpoint tools in turn inside one set of ranks.

Usage: torchrun --nproc_per_node 2 tests/megatron/convert_worker.py STEPS.json
with STEPS.json a list of [tool, argv] pairs, tool one of hf_to_torch_dist, torch_dist_to_hf.
"""

from __future__ import annotations

import json
import sys

from tools import convert_hf_to_torch_dist, convert_torch_dist_to_hf

TOOLS = {"hf_to_torch_dist": convert_hf_to_torch_dist.main, "torch_dist_to_hf": convert_torch_dist_to_hf.main}


def main(steps_file: str) -> None:
    """Run every step (the tools keep the process group between steps), then tear it down."""
    from slime_like.trainer.megatron.parallel import destroy_parallel

    for tool, argv in json.loads(open(steps_file).read()):
        TOOLS[tool](argv)
    destroy_parallel()


if __name__ == "__main__":
    main(sys.argv[1])
