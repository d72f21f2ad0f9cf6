"""Placement plan and per-GPU memory estimate of a run: checked on every start, printed by --dry-run.

Two kinds of findings, treated differently on purpose:

- Layout problems (engines not dividing the rollout GPUs, an engine straddling nodes, TP/PP/EP not dividing
  heads/layers/experts/ranks, more trainer ranks per node than the node has) are facts about the flags and the
  HF config: such a run cannot be placed, or would silently drop GPUs. They stop every start, before anything is
  launched, naming the flags and the numbers (`parse_args`), and make --dry-run exit 1.
- The memory estimate is arithmetic on an assumed GPU size (--gpu-memory-gb, 80 unless given), never measured.
  On CPU runs, or GPUs of another size, it does not apply, so at a real start an estimate over the budget is a
  warning only; --dry-run, whose job is to say whether a plan fits the declared GPUs, refuses it (exit 1).

Training memory per GPU follows the usual mixed-precision Adam accounting (weights in the training
dtype, fp32 gradients, fp32 master weights plus two Adam moments = 12 bytes per parameter, the
optimizer part divided over data-parallel ranks with the distributed optimizer) and the activation
estimate of Korthikanti et al., 2022 ("Reducing Activation Recomputation in Large Transformer
Models"): about 34 * tokens * hidden bytes per layer in 16-bit, divided by TP.

The head-count rules are those of the two engines: Megatron-core's TransformerConfig needs
num_attention_heads % TP == 0 and num_query_groups a multiple or a divisor of TP; SGLang's attention layers
(qwen2/qwen3/llama) need heads % attention-TP == 0 and KV heads a multiple or a divisor of it (replicated when
fewer), where attention-TP is the engine's TP, divided by --dp-size under --enable-dp-attention.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slime_like.core.hf_config import hf_field, hf_field_named
from slime_like.model_size import ModelSize, model_size

GIB = 1024**3


@dataclass
class Plan:
    """What --dry-run prints: layout problems stop every start; memory problems are estimates (see the module)."""

    lines: list[str]
    problems: list[str]  # the layout cannot be placed: an error on every start
    memory: list[str] = field(default_factory=list)  # over the assumed --gpu-memory-gb: an error only under --dry-run


def _dp_sizes(args: Any) -> tuple[int, int]:
    """Data-parallel size of dense and of expert parameters."""
    world = args.world_size
    dense_dp = world // (
        args.tensor_model_parallel_size * args.pipeline_model_parallel_size * args.context_parallel_size
    )
    etp = args.expert_tensor_parallel_size or args.tensor_model_parallel_size
    expert_dp = world // (args.expert_model_parallel_size * etp * args.pipeline_model_parallel_size)
    return dense_dp, max(1, expert_dp)


def _layers_per_stage(args: Any, layers: int) -> int | None:
    """Most layers on one pipeline stage, or None if the split is impossible."""
    pp = args.pipeline_model_parallel_size
    first, last = args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers
    middle_stages = pp - (first is not None) - (last is not None)
    middle = layers - (first or 0) - (last or 0)
    if middle < 0 or (middle_stages == 0 and middle) or (middle_stages and middle % middle_stages):
        return None
    return max(first or 0, last or 0, middle // middle_stages if middle_stages else 0)


def training_memory(args: Any, size: ModelSize) -> dict[str, float]:
    """Bytes per trainer GPU: weights, grads, optimizer states, activations."""
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    etp = args.expert_tensor_parallel_size or tp
    dense_dp, expert_dp = _dp_sizes(args)
    dense = size.dense_params / (tp * pp)
    experts = size.expert_params / (args.expert_model_parallel_size * etp * pp)
    weight_bytes = 4 if args.bf16 is False else 2  # bf16 unless --no-bf16: plans are for GPUs
    optim_shards = (dense_dp, expert_dp) if args.use_distributed_optimizer else (1, 1)
    tokens = args.max_tokens_per_gpu / args.context_parallel_size
    return {
        "weights": (dense + experts) * weight_bytes,
        "grads": (dense + experts) * 4,
        # --optimizer-cpu-offload keeps the fp32 master weights and Adam moments in host memory (on GPU runs).
        "optimizer": 0.0
        if getattr(args, "optimizer_cpu_offload", False)
        else 12 * (dense / optim_shards[0] + experts / optim_shards[1]),
        "activations": 34
        * tokens
        * size.hidden
        * (_layers_per_stage(args, size.layers) or size.layers / pp)
        / tp
        * (weight_bytes / 2),
    }


def _sglang_mem_fraction(args: Any) -> float:
    """--sglang-mem-fraction-static if given, else 0.8 (about what SGLang picks on large GPUs)."""
    server_args = list(getattr(args, "sglang_server_args", []) or [])
    if "--mem-fraction-static" in server_args:
        return float(server_args[server_args.index("--mem-fraction-static") + 1])
    return 0.8


def rollout_memory(args: Any, size: ModelSize, gpu_bytes: float) -> dict[str, float]:
    """Bytes per rollout GPU: the engine's weights (16-bit, or FP8 as the checkpoint has them), and how many tokens
    of KV cache fit beside them."""
    tp = args.rollout_num_gpus_per_engine
    weights = size.total * size.served_bytes_per_param / tp
    room = gpu_bytes * _sglang_mem_fraction(args) - weights
    return {"weights": weights, "kv_room": room, "kv_tokens": max(0.0, room) * tp / size.kv_bytes_per_token}


# Flags that count devices or split a model: a 0 or a negative value is refused before any arithmetic on it.
POSITIVE_FLAGS = (
    "actor_num_nodes",
    "actor_num_gpus_per_node",
    "rollout_num_gpus",
    "rollout_num_gpus_per_engine",
    "num_gpus_per_node",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "num_nodes",
    "gpu_memory_gb",
)

MEMORY_WARNING = (
    "warning: {problem}. This is an estimate for GPUs of --gpu-memory-gb {gb:g} GiB (an assumed size, not "
    "measured): on CPU runs or GPUs of another size it does not apply, so the run starts anyway; set "
    "--gpu-memory-gb to your GPUs' memory to check it (--dry-run refuses a plan over it)"
)


def count_problems(args: Any) -> list[str]:
    """Device counts and parallel sizes that are not positive (checked before anything divides by them)."""
    problems = []
    for dest in POSITIVE_FLAGS:
        value = getattr(args, dest, None)
        if value is not None and value <= 0:
            problems.append(f"--{dest.replace('_', '-')} {value:g} must be positive")
    return problems


def _sglang_flag(args: Any, flag: str) -> str | bool | None:
    """The value of an SGLang server flag passed through as --sglang-X (True for a bare switch; None if absent)."""
    server_args = list(getattr(args, "sglang_server_args", []) or [])
    for i, token in enumerate(server_args):
        if token == flag:
            following = server_args[i + 1] if i + 1 < len(server_args) else None
            return following if following is not None and not following.startswith("--") else True
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
    return None


def _heads(config: Any) -> tuple[int, int]:
    """Attention heads and KV heads (query groups) of an HF config, outer or nested."""
    heads = hf_field(config, "num_attention_heads")
    return heads, hf_field(config, "num_key_value_heads") or heads


def _rollout_offset(args: Any) -> int:
    """First GPU of the rollout side in placement order: 0 when colocated, after the trainer's GPUs if not
    (slime_like/placement.py reserves the trainer's bundles first, then the rollout's, packed node by node)."""
    return 0 if args.colocate else args.world_size


def _rollout_layout_problems(args: Any, config: Any) -> list[str]:
    """SGLang engines: they divide the rollout GPUs, sit in whole nodes, and split the attention heads."""
    gpus, per_engine, per_node = args.rollout_num_gpus, args.rollout_num_gpus_per_engine, args.num_gpus_per_node
    problems = []
    if gpus % per_engine:
        problems.append(
            f"--rollout-num-gpus {gpus} is not a multiple of --rollout-num-gpus-per-engine {per_engine}: "
            f"{gpus // per_engine} engine(s) would leave {gpus % per_engine} rollout GPU(s) unused"
        )
    straddle = False
    if per_engine > per_node and per_engine % per_node:
        straddle = True
        problems.append(
            f"--rollout-num-gpus-per-engine {per_engine} is wider than a node (--num-gpus-per-node {per_node}) but "
            f"not a multiple of it: an engine would span {per_engine // per_node} whole node(s) and "
            f"{per_engine % per_node} GPU(s) of another (use a multiple of {per_node})"
        )
    if per_engine < per_node and per_node % per_engine:
        straddle = True
        problems.append(
            f"--rollout-num-gpus-per-engine {per_engine} does not divide --num-gpus-per-node {per_node}: an engine "
            f"would straddle two nodes (use a divisor of {per_node})"
        )
    offset = _rollout_offset(args)
    if not straddle:
        for engine in range(gpus // per_engine):
            first = offset + engine * per_engine
            last = first + per_engine - 1
            if per_engine > per_node and first % per_node:
                where = f"starting at GPU {first % per_node} of node {first // per_node}, not on a node's first GPU"
            elif per_engine <= per_node and first // per_node != last // per_node:
                where = f"across nodes {first // per_node} and {last // per_node}"
            else:
                continue
            problems.append(
                f"the rollout GPUs follow the trainer's {offset} (--actor-num-nodes {args.actor_num_nodes} x "
                f"--actor-num-gpus-per-node {args.actor_num_gpus_per_node}, not --colocate), so engine {engine} of "
                f"--rollout-num-gpus-per-engine {per_engine} would take GPUs {first}-{last}, {where} "
                f"(--num-gpus-per-node {per_node}): make the trainer's GPUs a multiple of "
                f"{min(per_engine, per_node)}, or use --colocate"
            )
            break
    heads, kv_heads = _heads(config)
    attn_tp, how = per_engine, f"--rollout-num-gpus-per-engine {per_engine}"
    dp_size = _sglang_flag(args, "--dp-size")
    if _sglang_flag(args, "--enable-dp-attention") and isinstance(dp_size, str) and dp_size.isdigit():
        if per_engine % int(dp_size):
            problems.append(f"--sglang-dp-size {dp_size} does not divide --rollout-num-gpus-per-engine {per_engine}")
            return problems
        attn_tp = per_engine // int(dp_size)
        how = f"{how} / --sglang-dp-size {dp_size} with --sglang-enable-dp-attention = {attn_tp}"
    if heads % attn_tp:
        problems.append(
            f"{heads} attention heads (num_attention_heads of the HF config) do not divide over SGLang's attention "
            f"tensor parallel size ({how})"
        )
    elif not hf_field(config, "kv_lora_rank") and kv_heads % attn_tp and attn_tp % kv_heads:
        problems.append(
            f"{kv_heads} KV heads (num_key_value_heads of the HF config) and SGLang's attention tensor parallel "
            f"size ({how}): one must divide the other (SGLang splits or replicates KV heads)"
        )
    return problems


def _training_layout_problems(args: Any, config: Any) -> list[str]:
    """Megatron: trainer ranks fit the nodes; TP, PP and EP divide heads, layers, experts and ranks."""
    problems = []
    tp, pp, ep = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.expert_model_parallel_size
    if args.actor_num_gpus_per_node > args.num_gpus_per_node:
        problems.append(
            f"--actor-num-gpus-per-node {args.actor_num_gpus_per_node} exceeds --num-gpus-per-node "
            f"{args.num_gpus_per_node}"
        )
    heads, kv_heads = _heads(config)
    if heads % tp:
        problems.append(
            f"{heads} attention heads (num_attention_heads of the HF config) do not divide over "
            f"--tensor-model-parallel-size {tp}"
        )
    if kv_heads % tp and tp % kv_heads:
        problems.append(
            f"{kv_heads} KV heads (num_key_value_heads of the HF config, Megatron's --num-query-groups) and "
            f"--tensor-model-parallel-size {tp}: one must divide the other"
        )
    layers = hf_field(config, "num_hidden_layers")
    if _layers_per_stage(args, layers) is None:
        first, last = args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers
        given = "".join(
            f", --decoder-{where}-pipeline-num-layers {n}" for where, n in (("first", first), ("last", last)) if n
        )
        problems.append(
            f"{layers} layers (num_hidden_layers of the HF config) do not divide over "
            f"--pipeline-model-parallel-size {pp}{given} "
            "(set --decoder-first/last-pipeline-num-layers for uneven stages)"
        )
    experts_field, experts = hf_field_named(config, "num_experts")
    if ep > 1 and not experts:
        problems.append(f"--expert-model-parallel-size {ep} on a model without routed experts (use 1)")
    elif ep > 1 and experts % ep:
        problems.append(
            f"{experts} experts ({experts_field} of the HF config) do not divide over --expert-model-parallel-size {ep}"
        )
    etp = args.expert_tensor_parallel_size or tp
    per_stage = args.world_size // pp
    if per_stage % (ep * etp):
        problems.append(
            f"--expert-model-parallel-size {ep} x --expert-tensor-parallel-size {etp} must divide the {per_stage} "
            f"trainer ranks of a pipeline stage (--actor-num-nodes x --actor-num-gpus-per-node = {args.world_size} "
            f"over --pipeline-model-parallel-size {pp})"
        )
    if hf_field(config, "index_topk") and args.context_parallel_size > 1:  # GLM-5's DSA (trainer/megatron/dsa.py)
        problems.append(
            f"--context-parallel-size {args.context_parallel_size}: megatron-core 0.16's DeepSeek sparse attention "
            "(GLM-5) has no context parallelism (slime's --allgather-cp comes with its own GLM-5 layer spec); use "
            "--context-parallel-size 1"
        )
    return problems


def layout_problems(args: Any, config: Any) -> list[str]:
    """Every reason this layout cannot be placed, naming the flags and the numbers (empty: it can)."""
    problems = count_problems(args)
    if problems:
        return problems
    problems = _training_layout_problems(args, config)
    if not getattr(args, "debug_train_only", False):  # it starts no SGLang engine (rollout/manager.py)
        problems += _rollout_layout_problems(args, config)
    nodes = -(-_total_gpus(args) // args.num_gpus_per_node)
    if args.num_nodes and nodes > args.num_nodes:
        problems.append(
            f"the plan needs {nodes} nodes of --num-gpus-per-node {args.num_gpus_per_node} for {_total_gpus(args)} "
            f"GPUs ({_gpus_used(args)}) but --num-nodes is {args.num_nodes}"
        )
    return problems


def _total_gpus(args: Any) -> int:
    """GPUs the run reserves: shared when colocated, trainer's plus rollout's if not."""
    if args.colocate:
        return max(args.world_size, args.rollout_num_gpus)
    return args.world_size + args.rollout_num_gpus


def _gpus_used(args: Any) -> str:
    """How the GPU total comes about, in flag names."""
    if args.colocate:
        return (
            f"--colocate: the larger of the trainer's {args.world_size} and --rollout-num-gpus {args.rollout_num_gpus}"
        )
    return f"the trainer's {args.world_size} + --rollout-num-gpus {args.rollout_num_gpus}"


def make_plan(args: Any, config: Any) -> Plan:
    """The placement and memory plan of these arguments on the declared cluster."""
    problems = layout_problems(args, config)
    if count_problems(args):
        return Plan([], problems)
    size = model_size(config)
    gpu_bytes = args.gpu_memory_gb * GIB
    per_node = args.num_gpus_per_node
    dense_dp, expert_dp = _dp_sizes(args)
    engines = args.rollout_num_gpus // args.rollout_num_gpus_per_engine
    total_gpus = _total_gpus(args)
    nodes = -(-total_gpus // per_node)
    lines = [
        f"model: {hf_field(config, 'model_type')}, {size.total / 1e9:.2f}B parameters ({size.expert_params / 1e9:.2f}B in routed experts)",
        f"placement: {'colocated' if args.colocate else 'disaggregated'}, {nodes} node(s) x {per_node} GPUs, {total_gpus} GPUs used",
        f"  training: {args.actor_num_nodes} node(s) x {args.actor_num_gpus_per_node} = {args.world_size} ranks; "
        f"TP {args.tensor_model_parallel_size} x PP {args.pipeline_model_parallel_size} x CP {args.context_parallel_size} "
        f"-> DP {dense_dp}; EP {args.expert_model_parallel_size} (expert DP {expert_dp})",
    ]
    train_only = getattr(args, "debug_train_only", False)
    if train_only:
        lines.append("  rollout: no SGLang engine (--debug-train-only: rollouts from files or --rollout-function-path)")
    else:
        lines.append(
            f"  rollout: {args.rollout_num_gpus} GPUs = {engines} SGLang engine(s) x TP "
            f"{args.rollout_num_gpus_per_engine}, "
            + (
                f"{per_node // args.rollout_num_gpus_per_engine} engine(s) per node"
                if args.rollout_num_gpus_per_engine <= per_node
                else f"each engine spans {-(-args.rollout_num_gpus_per_engine // per_node)} nodes"
            )
        )
    memory = []
    train = training_memory(args, size)
    total_train = sum(train.values())
    lines.append(
        "  memory per training GPU: "
        + " + ".join(f"{k} {v / GIB:.1f}" for k, v in train.items())
        + f" = {total_train / GIB:.1f} GiB of {args.gpu_memory_gb:g}"
    )
    serve = rollout_memory(args, size, gpu_bytes)
    if not train_only:
        lines.append(
            f"  memory per rollout GPU: weights {serve['weights'] / GIB:.1f} GiB, KV cache room "
            f"{max(0.0, serve['kv_room']) / GIB:.1f} GiB = {serve['kv_tokens'] / 1e3:.0f}k tokens per engine"
        )
    if total_train > 0.95 * gpu_bytes:
        memory.append(
            f"training needs about {total_train / GIB:.1f} GiB per GPU, more than the {args.gpu_memory_gb:g} GiB there: "
            "raise --tensor-model-parallel-size / --pipeline-model-parallel-size / --expert-model-parallel-size, "
            "add --use-distributed-optimizer or --bf16, or lower --max-tokens-per-gpu"
        )
    needed_tokens = args.rollout_max_response_len + (args.rollout_max_prompt_len or 0)
    if not train_only and (serve["kv_room"] <= 0 or serve["kv_tokens"] < needed_tokens):
        memory.append(
            f"an SGLang engine's weights ({serve['weights'] / GIB:.1f} GiB per GPU) leave KV-cache room for "
            f"{serve['kv_tokens']:.0f} tokens, less than one sequence ({needed_tokens}): raise --rollout-num-gpus-per-engine"
        )
    return Plan(lines, problems, memory)


def add_plan_arguments(parser: Any) -> None:
    """Flags of --dry-run and of the cluster the plan is checked against."""
    g = parser.add_argument_group("plan")
    g.add_argument(
        "--dry-run",
        action="store_true",
        help="check every argument, print the plan, start nothing (exit 1 if the layout cannot be placed or the "
        "memory estimate exceeds --gpu-memory-gb)",
    )
    g.add_argument(
        "--num-gpus-per-node",
        type=int,
        default=8,
        help="GPUs per node of the cluster (on CPU runs: device bundles); every start checks that trainer ranks and "
        "SGLang engines fit whole nodes of this size",
    )
    g.add_argument("--num-nodes", type=int, default=None, help="nodes of the cluster (checked when given)")
    g.add_argument(
        "--gpu-memory-gb",
        type=float,
        default=80.0,
        help="memory of one GPU, for the memory estimate (a warning at start, an error under --dry-run)",
    )


def load_hf_config(path: str) -> Any:
    """The checkpoint's transformers config (the checkpoint need not hold weights for a dry run); the planner reads
    its language model's part, nested or not (`core.hf_config.hf_field`)."""
    from slime_like.trainer.model_arguments import read_hf_config

    return read_hf_config(path)


def dry_run(plan: Plan) -> int:
    """Print the plan; 0 if it can be placed and fits the declared GPUs, 1 (with the reasons) if not."""
    print("\n".join(plan.lines))
    problems = plan.problems + plan.memory
    for problem in problems:
        print(f"error: {problem}")
    print("dry run: " + ("OK, nothing started" if not problems else f"{len(problems)} problem(s)"))
    return 1 if problems else 0
