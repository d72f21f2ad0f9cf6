"""Placement plan and per-GPU memory estimate of a run, printed by --dry-run; refuses plans that cannot fit.

Training memory per GPU follows the usual mixed-precision Adam accounting (weights in the training
dtype, fp32 gradients, fp32 master weights plus two Adam moments = 12 bytes per parameter, the
optimizer part divided over data-parallel ranks with the distributed optimizer) and the activation
estimate of Korthikanti et al., 2022 ("Reducing Activation Recomputation in Large Transformer
Models"): about 34 * tokens * hidden bytes per layer in 16-bit, divided by TP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 1024**3


@dataclass
class ModelSize:
    """Parameter counts and KV-cache cost of one model."""

    dense_params: int  # everything that is not a routed expert
    expert_params: int  # all routed experts of all layers
    layers: int
    hidden: int
    kv_bytes_per_token: int  # 16-bit K and V over all layers

    @property
    def total(self) -> int:
        """All parameters."""
        return self.dense_params + self.expert_params


def model_size(config: Any) -> ModelSize:
    """Count parameters from an HF config (dense, MoE, and DeepSeek-style MLA attention)."""
    h, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    heads = config.num_attention_heads
    kv_lora = getattr(config, "kv_lora_rank", None)
    if kv_lora:  # multi-latent attention
        q_lora = getattr(config, "q_lora_rank", None)
        qk = config.qk_nope_head_dim + config.qk_rope_head_dim
        q = (h * q_lora + q_lora + q_lora * heads * qk) if q_lora else h * heads * qk
        kv = (
            h * (kv_lora + config.qk_rope_head_dim)
            + kv_lora
            + kv_lora * heads * (config.qk_nope_head_dim + config.v_head_dim)
        )
        attention = q + kv + heads * config.v_head_dim * h
        kv_per_token = layers * (kv_lora + config.qk_rope_head_dim) * 2  # the latent is what is cached
    else:
        head_dim = getattr(config, "head_dim", None) or h // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        attention = h * heads * head_dim + 2 * h * kv_heads * head_dim + heads * head_dim * h
        if config.model_type.startswith("qwen3"):
            attention += 2 * head_dim  # RMSNorm on queries and keys
        kv_per_token = layers * 2 * kv_heads * head_dim * 2
    experts = getattr(config, "num_experts", None) or getattr(config, "n_routed_experts", None) or 0
    dense_mlp = 3 * h * config.intermediate_size
    moe_layers = 0
    if experts:
        first_dense = getattr(config, "first_k_dense_replace", 0) or 0
        only_dense = set(getattr(config, "mlp_only_layers", []) or [])
        moe_layers = sum(1 for i in range(layers) if i >= first_dense and i not in only_dense)
    shared = (getattr(config, "n_shared_experts", 0) or 0) * (getattr(config, "moe_intermediate_size", 0) or 0)
    moe_dense_part = h * experts + 3 * h * shared  # router and shared experts of a MoE layer
    expert_params = moe_layers * experts * 3 * h * (getattr(config, "moe_intermediate_size", 0) or 0)
    per_layer_norms = 2 * h
    dense = layers * (attention + per_layer_norms) + (layers - moe_layers) * dense_mlp + moe_layers * moe_dense_part
    embeddings = vocab * h * (1 if getattr(config, "tie_word_embeddings", False) else 2) + h
    return ModelSize(dense + embeddings, expert_params, layers, h, kv_per_token)


@dataclass
class Plan:
    """What --dry-run prints, and what does not fit."""

    lines: list[str]
    problems: list[str]


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
        "optimizer": 12 * (dense / optim_shards[0] + experts / optim_shards[1]),
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
    """Bytes per rollout GPU: weights of a 16-bit engine, and how many tokens of KV cache fit beside them."""
    tp = args.rollout_num_gpus_per_engine
    weights = size.total * 2 / tp
    room = gpu_bytes * _sglang_mem_fraction(args) - weights
    return {"weights": weights, "kv_room": room, "kv_tokens": max(0.0, room) * tp / size.kv_bytes_per_token}


def make_plan(args: Any, config: Any) -> Plan:
    """The placement and memory plan of these arguments on the declared cluster."""
    size = model_size(config)
    gpu_bytes = args.gpu_memory_gb * GIB
    per_node = args.num_gpus_per_node
    dense_dp, expert_dp = _dp_sizes(args)
    engines = args.rollout_num_gpus // args.rollout_num_gpus_per_engine
    train_gpus = args.world_size
    total_gpus = max(train_gpus, args.rollout_num_gpus) if args.colocate else train_gpus + args.rollout_num_gpus
    nodes = -(-total_gpus // per_node)
    lines = [
        f"model: {config.model_type}, {size.total / 1e9:.2f}B parameters ({size.expert_params / 1e9:.2f}B in routed experts)",
        f"placement: {'colocated' if args.colocate else 'disaggregated'}, {nodes} node(s) x {per_node} GPUs, {total_gpus} GPUs used",
        f"  training: {args.actor_num_nodes} node(s) x {args.actor_num_gpus_per_node} = {train_gpus} ranks; "
        f"TP {args.tensor_model_parallel_size} x PP {args.pipeline_model_parallel_size} x CP {args.context_parallel_size} "
        f"-> DP {dense_dp}; EP {args.expert_model_parallel_size} (expert DP {expert_dp})",
        f"  rollout: {args.rollout_num_gpus} GPUs = {engines} SGLang engine(s) x TP {args.rollout_num_gpus_per_engine}, "
        + (
            f"{per_node // args.rollout_num_gpus_per_engine} engine(s) per node"
            if args.rollout_num_gpus_per_engine <= per_node
            else f"each engine spans {-(-args.rollout_num_gpus_per_engine // per_node)} nodes"
        ),
    ]
    problems = []
    if args.rollout_num_gpus % args.rollout_num_gpus_per_engine:
        problems.append(
            f"--rollout-num-gpus {args.rollout_num_gpus} is not a multiple of --rollout-num-gpus-per-engine {args.rollout_num_gpus_per_engine}"
        )
    if args.actor_num_gpus_per_node > per_node:
        problems.append(
            f"--actor-num-gpus-per-node {args.actor_num_gpus_per_node} exceeds --num-gpus-per-node {per_node}"
        )
    if args.num_nodes and nodes > args.num_nodes:
        problems.append(f"the plan needs {nodes} nodes of {per_node} GPUs but --num-nodes is {args.num_nodes}")
    etp = args.expert_tensor_parallel_size or args.tensor_model_parallel_size
    per_stage = args.world_size // args.pipeline_model_parallel_size
    if per_stage % (args.expert_model_parallel_size * etp):
        problems.append(
            f"--expert-model-parallel-size {args.expert_model_parallel_size} x --expert-tensor-parallel-size {etp} must "
            f"divide the {per_stage} ranks of a pipeline stage"
        )
    experts = getattr(config, "num_experts", None) or getattr(config, "n_routed_experts", None) or 0
    if args.expert_model_parallel_size > 1 and experts % args.expert_model_parallel_size:
        problems.append(
            f"{experts} experts do not divide over --expert-model-parallel-size {args.expert_model_parallel_size}"
        )
    stage_layers = _layers_per_stage(args, config.num_hidden_layers)
    if stage_layers is None:
        problems.append(
            f"{config.num_hidden_layers} layers do not divide over --pipeline-model-parallel-size "
            f"{args.pipeline_model_parallel_size} (set --decoder-first/last-pipeline-num-layers for uneven stages)"
        )
    if config.num_attention_heads % args.tensor_model_parallel_size:
        problems.append(
            f"{config.num_attention_heads} attention heads do not divide over --tensor-model-parallel-size {args.tensor_model_parallel_size}"
        )
    train = training_memory(args, size)
    total_train = sum(train.values())
    lines.append(
        "  memory per training GPU: "
        + " + ".join(f"{k} {v / GIB:.1f}" for k, v in train.items())
        + f" = {total_train / GIB:.1f} GiB of {args.gpu_memory_gb:g}"
    )
    serve = rollout_memory(args, size, gpu_bytes)
    lines.append(
        f"  memory per rollout GPU: weights {serve['weights'] / GIB:.1f} GiB, KV cache room "
        f"{max(0.0, serve['kv_room']) / GIB:.1f} GiB = {serve['kv_tokens'] / 1e3:.0f}k tokens per engine"
    )
    if total_train > 0.95 * gpu_bytes:
        problems.append(
            f"training needs about {total_train / GIB:.1f} GiB per GPU, more than the {args.gpu_memory_gb:g} GiB there: "
            "raise --tensor-model-parallel-size / --pipeline-model-parallel-size / --expert-model-parallel-size, "
            "add --use-distributed-optimizer or --bf16, or lower --max-tokens-per-gpu"
        )
    needed_tokens = args.rollout_max_response_len + (args.rollout_max_prompt_len or 0)
    if serve["kv_room"] <= 0 or serve["kv_tokens"] < needed_tokens:
        problems.append(
            f"an SGLang engine's weights ({serve['weights'] / GIB:.1f} GiB per GPU) leave KV-cache room for "
            f"{serve['kv_tokens']:.0f} tokens, less than one sequence ({needed_tokens}): raise --rollout-num-gpus-per-engine"
        )
    return Plan(lines, problems)


def add_plan_arguments(parser: Any) -> None:
    """Flags of --dry-run and of the cluster the plan is checked against."""
    g = parser.add_argument_group("plan")
    g.add_argument("--dry-run", action="store_true", help="check every argument, print the plan, start nothing")
    g.add_argument("--num-gpus-per-node", type=int, default=8, help="GPUs per node of the cluster")
    g.add_argument("--num-nodes", type=int, default=None, help="nodes of the cluster (checked when given)")
    g.add_argument("--gpu-memory-gb", type=float, default=80.0, help="memory of one GPU, for the estimate")


def load_hf_config(path: str) -> Any:
    """The checkpoint's transformers config (the checkpoint need not hold weights for a dry run)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)


def dry_run(args: Any, config: Any) -> int:
    """Print the plan; 0 if it fits, 1 (with the reasons) if not."""
    plan = make_plan(args, config)
    print("\n".join(plan.lines))
    for problem in plan.problems:
        print(f"error: {problem}")
    print("dry run: " + ("OK, nothing started" if not plan.problems else f"{len(plan.problems)} problem(s)"))
    return 1 if plan.problems else 0
