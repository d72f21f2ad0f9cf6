"""torchrun worker: the MTP loss under zig-zag context parallel (CP 2, DP 1) on two gloo ranks.

Usage: torchrun --nproc_per_node 2 tests/megatron/mtp_cp_worker.py OUT_DIR

Megatron's local attention refuses CP > 1 (model.make_bridge says so), so an MTP layer with attention cannot run under
CP on a CPU. What runs here is megatron-core's own MultiTokenPredictionBlock, two layers deep, whose layer has no
attention (enorm, hnorm, eh_proj, an MLP layer, final_layernorm: position-wise, so CP changes nothing inside them),
and every step of the engine's MTP path around it: the block's shift of the token ids over the CP ranks
(roll_tensor with the "thd" PackedSeqParams of packing.py), MTPTraining.begin_step and set_targets on this rank's
zig-zag shard, mtp._postprocess's loss, take_loss's sum of the logged losses over CP, the engine's loss_rescale and
Megatron's forward_step_calc_loss, and DDP's gradient average over DP x CP. A stand-in trunk (embedding -> tanh)
gives the main hidden states. Each rank saves the logged losses and the MTP block's averaged gradients to
OUT_DIR/rank{r}.pt; the test compares them with one process's (run_step at CP 1).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

VOCAB, HIDDEN, DEPTH = 512, 16, 2


class _Embedding(torch.nn.Module):
    """GPTModel.embedding's interface: [b, s] ids -> [s, b, h]."""

    def __init__(self) -> None:
        super().__init__()
        self.word = torch.nn.Embedding(VOCAB, HIDDEN)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return self.word(input_ids).transpose(0, 1)


class _OutputLayer(torch.nn.Module):
    """GPTModel.output_layer's interface: [s, b, h] -> ([s, b, v], bias)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(VOCAB, HIDDEN))

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor | None = None, runtime_gather_output=None):
        return torch.nn.functional.linear(hidden, self.weight if weight is None else weight), None


class ToyGPT(torch.nn.Module):
    """The parts of a last-stage GPTModel that mtp._postprocess uses, around a real MTP block."""

    def __init__(self, seed: int = 0) -> None:
        from megatron.core import parallel_state as mpu
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
        from megatron.core.transformer.enums import AttnMaskType
        from megatron.core.transformer.identity_op import IdentityOp
        from megatron.core.transformer.multi_token_prediction import MultiTokenPredictionBlock
        from megatron.core.transformer.spec_utils import ModuleSpec
        from megatron.core.transformer.transformer_config import TransformerConfig
        from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

        from slime_like.trainer.megatron.cpu_compat import cuda_to_cpu

        super().__init__()
        self.config = TransformerConfig(
            num_layers=1, hidden_size=HIDDEN, ffn_hidden_size=2 * HIDDEN, num_attention_heads=2, mtp_num_layers=DEPTH,
            context_parallel_size=mpu.get_context_parallel_world_size(), normalization="RMSNorm",
            use_cpu_initialization=True, hidden_dropout=0.0, attention_dropout=0.0, bias_dropout_fusion=False,
            gradient_accumulation_fusion=False, persist_layer_norm=False, bias_activation_fusion=False,
        )  # fmt: skip
        local = get_gpt_layer_local_spec(normalization="RMSNorm").submodules
        mlp_layer = ModuleSpec(
            module=TransformerLayer,
            submodules=TransformerLayerSubmodules(
                self_attention=ModuleSpec(module=IdentityOp, params={"attn_mask_type": AttnMaskType.causal}),
                pre_mlp_layernorm=local.pre_mlp_layernorm,
                mlp=local.mlp,
                mlp_bda=local.mlp_bda,
            ),
        )
        with cuda_to_cpu():
            self.mtp = MultiTokenPredictionBlock(self.config, get_gpt_mtp_block_spec(self.config, mlp_layer, False))
        self.trunk = torch.nn.Embedding(VOCAB, HIDDEN)
        self.embedding = _Embedding()
        self.output_layer = _OutputLayer()
        self.post_process, self.share_embeddings_and_output_weights = True, False
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # the same weights in every process, whatever Megatron's initialisation did
            for name, param in self.named_parameters():
                noise = torch.randn(param.shape, generator=g)
                param.copy_(1 + 0.1 * noise if "norm" in name else 0.3 * noise)

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor, packed_seq_params) -> torch.Tensor:
        """The stand-in trunk's hidden states, then the (patched) GPTModel._postprocess."""
        hidden = torch.tanh(self.trunk(tokens)).transpose(0, 1)
        return self._postprocess(
            hidden, tokens, position_ids, None, None, None, None, mtp_in_postprocess=True,
            packed_seq_params=packed_seq_params,
        )  # fmt: skip


def loss_masks(seqs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per sequence which targets the MTP loss counts (a prompt of 3 tokens, then some response tokens masked)."""
    return [torch.tensor([float(i >= 2 and i % 3 != 1) for i in range(len(s) - 1)]) for s in seqs]


def run_step(cp: int, cp_rank: int) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """One step of the MTP loss on the fixed batch: the logged losses summed over micro-batches, and the gradients
    (at CP > 1 as Megatron's schedule and DDP leave them: averaged over DP x CP)."""
    from megatron.core import parallel_state as mpu
    from megatron.core.pipeline_parallel.schedules import forward_step_calc_loss

    from slime_like.trainer.megatron import context_parallel as cp_lib
    from slime_like.trainer.megatron.mtp import MTPTraining
    from slime_like.trainer.megatron.schedule import loss_rescale
    from tests.megatron.common import fixed_batch
    from tests.megatron.cp_worker import micro_batches

    seqs = fixed_batch()
    gpt = ToyGPT()
    training = MTPTraining([gpt], DEPTH, 0.4)
    training.begin_step([len(s) for s in seqs], loss_masks(seqs))
    mbs = micro_batches(seqs, cp=2)  # "thd", every sequence padded to a multiple of 4, at CP 1 too
    config = SimpleNamespace(timers=None, calculate_per_token_loss=False)  # what forward_step_calc_loss reads
    logged: dict[str, float] = {}
    for mb in mbs:
        shard = cp_lib.shard(mb, cp, cp_rank) if cp > 1 else None
        tokens, positions = (mb.tokens, mb.position_ids) if shard is None else (shard.tokens, shard.position_ids)
        training.set_targets(gpt, mb, torch.device("cpu"), shard)
        gpt(tokens, positions, mb.packed_seq_params())
        share, metrics = training.take_loss(gpt)
        for key, value in metrics.items():
            logged[key] = logged.get(key, 0.0) + float(value)
        if cp == 1:
            share.backward()
            continue
        scaled = share * loss_rescale(len(mbs))
        output, _ = forward_step_calc_loss(
            gpt, scaled, lambda out: (out, {}), config, None, False, len(mbs), [], cp_group_size=cp, is_last_stage=True
        )
        output.backward()
    training.end_step()
    grads = {}
    for name, param in gpt.named_parameters():
        if param.grad is None:
            continue
        grad = param.grad
        if cp > 1:  # Megatron's DDP: gradients times 1 / (DP x CP), summed over the DP x CP group
            grad = grad / mpu.get_data_parallel_world_size(with_context_parallel=True)
            dist.all_reduce(grad, group=mpu.get_data_parallel_group(with_context_parallel=True))
        grads[name] = grad
    return logged, grads


def main(out_dir: str) -> None:
    """The step at CP 2; each rank saves its logged losses and gradients."""
    from megatron.core import parallel_state as mpu

    from slime_like.trainer.megatron.parallel import init_parallel

    init_parallel(cp=2, seed=1234)
    assert mpu.get_context_parallel_world_size() == 2 and mpu.get_data_parallel_world_size() == 1
    logged, grads = run_step(2, mpu.get_context_parallel_rank())
    torch.save({"logged": logged, "grads": grads}, Path(out_dir) / f"rank{dist.get_rank()}.pt")
    mpu.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
