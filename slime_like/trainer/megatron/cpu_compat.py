"""Run Megatron-core on a CPU-only machine: four process-wide adaptations and the config choices.

Megatron-core and mbridge hard-code CUDA in a few places (buffer placement, `.cuda()` calls,
`param.type() == "torch.cuda.FloatTensor"` checks, `torch.cuda.synchronize()` in pipeline p2p, the
MoE all-to-all token dispatcher's device-to-host side stream). When CUDA is not available, `apply_cpu_compat()` makes those resolve to the CPU; with CUDA it does
nothing. The config choices that need no patch (fusions off, torch norms, p2p without batching, the
no-op RNG tracker) live here too; the other one, always passing an explicit causal mask (Megatron
builds its default mask on "cuda"), is kept by packing.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import random
from typing import Any

import torch
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

ON_CUDA: bool = torch.cuda.is_available()
_APPLIED = False


def _is_cuda(device: Any) -> bool:
    """True for a cuda device given as a str or a torch.device."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return False


class CudaToCpuMode(TorchFunctionMode):
    """Maps every cuda device in torch calls to the CPU and reports CPU tensors as cuda types."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            # `.cuda()` / `.cuda(device)` / `Module.cuda()`: the tensor already lives where it should.
            return args[0]
        if func is torch.Tensor.type:
            return self._tensor_type(func, args, kwargs)
        device = kwargs.get("device")
        # An int device (what torch.cuda.current_device() used to return) means a cuda index.
        if _is_cuda(device) or (isinstance(device, int) and not isinstance(device, bool)):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to:
            args = tuple("cpu" if _is_cuda(a) else a for a in args)
        return func(*args, **kwargs)

    @staticmethod
    def _tensor_type(func, args, kwargs):
        # Optimizer and clip-grad code checks `param.type() == "torch.cuda.FloatTensor"`.
        if len(args) == 1 and not kwargs:
            name = func(*args)
            return name if ".cuda." in name else name.replace("torch.", "torch.cuda.", 1)
        args = tuple(a.replace(".cuda.", ".") if isinstance(a, str) else a for a in args)
        if isinstance(kwargs.get("dtype"), str):
            kwargs["dtype"] = kwargs["dtype"].replace(".cuda.", ".")
        return func(*args, **kwargs)


def transformer_engine_available() -> bool:
    """Whether Megatron's Transformer Engine layer spec can run here: CUDA and transformer_engine installed."""
    return ON_CUDA and importlib.util.find_spec("transformer_engine") is not None


def _mode_active() -> bool:
    return any(isinstance(m, CudaToCpuMode) for m in _get_current_function_mode_stack())


def cuda_to_cpu() -> contextlib.AbstractContextManager:
    """Context manager mapping cuda to cpu in this thread (no-op with CUDA or when already active)."""
    if ON_CUDA or _mode_active():
        return contextlib.nullcontext()
    return CudaToCpuMode()


def apply_cpu_compat(global_mode: bool = True) -> None:
    """Apply the CPU adaptations once per process when CUDA is not available (idempotent).

    With `global_mode` the cuda-to-cpu mode stays active in the calling thread for the life of the
    process (it costs ~1 us per torch call); other threads use `cuda_to_cpu()` around their calls.
    """
    global _APPLIED
    _fix_missing_te()
    if ON_CUDA:
        return
    if not _APPLIED:
        # DDP param/grad buffers are placed with device=torch.cuda.current_device().
        torch.cuda.current_device = lambda: torch.device("cpu")
        # Pipeline p2p with variable sequence lengths synchronises the device: nothing to wait for.
        torch.cuda.synchronize = lambda device=None: None
        _cpu_moe_dispatcher()
        _APPLIED = True
    if global_mode and not _mode_active():
        CudaToCpuMode().__enter__()


def _fix_missing_te() -> None:
    """Two Megatron modules misjudge a missing Transformer Engine (on any device).

    The MoE router tests `te_general_gemm is not None` but defines it only when TE imports; MLA
    imports Megatron's TE extension, which succeeds with MagicMock classes when TE is absent.
    """
    if importlib.util.find_spec("transformer_engine") is not None:
        return
    from megatron.core.transformer import multi_latent_attention
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    multi_latent_attention.HAVE_TE = False


def _cpu_moe_dispatcher() -> None:
    """Let Megatron's all-to-all MoE token dispatcher run without a CUDA stream.

    It copies its split sizes device-to-host on a side stream it creates at construction; on the CPU
    they are host tensors already, so only the conversion to numpy (what the copy returns) remains.
    """
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    def dtoh_and_synchronize(self, point: str, tokens_per_expert: torch.Tensor | None = None):
        if not self.drop_and_pad and point == self.cuda_dtoh_point:
            for attr in ("input_splits", "output_splits", "output_splits_tp"):
                value = getattr(self, attr)
                if torch.is_tensor(value):
                    setattr(self, attr, value.numpy())
        return tokens_per_expert

    MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = "no stream on the CPU"  # skips torch.cuda.Stream()
    MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize = dtoh_and_synchronize


def transformer_config_overrides(local_spec: bool, sequence_parallel: bool = False) -> dict[str, Any]:
    """TransformerConfig fields for Megatron's local layer spec and for the CPU; with TE, sequence_parallel.

    mbridge turns sequence parallel on whenever TP > 1; here it follows --sequence-parallel (Megatron's
    default, off) on the TE spec, and is always off on the local spec.
    """
    overrides: dict[str, Any] = {"sequence_parallel": sequence_parallel and not local_spec}
    if local_spec:
        overrides.update(
            # Fused kernels come from apex/TE, which the local spec runs without.
            masked_softmax_fusion=False,
            bias_activation_fusion=False,
            bias_dropout_fusion=False,
            apply_rope_fusion=False,
            gradient_accumulation_fusion=False,
            cross_entropy_loss_fusion=False,
            moe_permute_fusion=False,
            moe_router_fusion=False,
            moe_grouped_gemm=False,
            # Overlapping shared experts runs them on a second CUDA stream.
            moe_shared_expert_overlap=False,
            # torch LayerNorm/RMSNorm assert on this (and on sequence_parallel, off above).
            persist_layer_norm=False,
        )
    if not ON_CUDA:
        overrides.update(
            # batch_isend_irecv + device synchronize is a CUDA-only path.
            batch_p2p_comm=False,
            batch_p2p_sync=False,
            use_cpu_initialization=True,
        )
    return overrides


def seed_all(seed: int) -> None:
    """Seed python, torch and Megatron's model-parallel RNG tracker (CPU: the no-op tracker)."""
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    random.seed(seed)
    torch.manual_seed(seed)
    # The regular tracker forks CUDA RNG states; the inference tracker is a no-op that works on CPU.
    model_parallel_cuda_manual_seed(seed, inference_rng_tracker=not ON_CUDA)
