"""Core attention from torch itself for Megatron's local layer spec (no Transformer Engine needed).

Megatron's local DotProductAttention is unfused: it materialises [b, heads, s, s] scores over a dense mask and
refuses packed (THD) micro-batches, so long micro-batches run out of memory on a GPU without TE. This module
is a drop-in core attention (same constructor and forward as DotProductAttention, same output layout) that
runs one of three torch paths:
- "varlen": torch.nn.attention.varlen.varlen_attn (Flash Attention over cu_seqlens): CUDA, fp16/bf16, equal
  q/k/v head sizes, no dropout.
- "flex": torch.nn.attention.flex_attention with a document-causal BlockMask built from cu_seqlens at block
  granularity (no [T, T] mask). Compiled on CUDA; eager on the CPU, where torch has no flex backward.
- "sdpa": scaled_dot_product_attention once per sequence (is_causal), or over the whole [S, B, H, D] batch.
A call the chosen path cannot run (dtype, device, gradients, dropout) takes the next path in that order, never
an approximation. GQA and sliding windows (config.window_size, per layer) run on every path; softmax offsets
(config.softmax_type off-by-one/learnable) on none, so those models keep Megatron's attention. Qwen3-Next / Qwen3.5's
hybrid spec takes it in its gated attention layers (gated_delta_net.hybrid_block_spec); GLM-5's DSA keeps its own.
`choose_attention` decides from the flag (--local-core-attention, local_kernels_flags.py) whether the spec uses it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
from typing import Any

import torch
import torch.nn.functional as F

from slime_like.trainer.megatron.local_kernels_flags import CORE_ATTENTION_CHOICES, CORE_ATTENTION_FLAG

PATHS = ("varlen", "flex", "sdpa")
CHOICES = CORE_ATTENTION_CHOICES  # auto, the paths, off
FLAG = CORE_ATTENTION_FLAG
_FLEX_BLOCK = 128  # flex_attention's default sparse block size


def choose_attention(
    requested: str | None,
    cuda: bool,
    transformer_engine: bool,
    softmax_type: str = "vanilla",
    dropout: float = 0.0,
    own_spec: bool = False,
) -> str | None:
    """The torch path the local spec's core attention uses, or None to keep Megatron's (TE or local).

    "auto" (default) picks varlen on CUDA without TE and keeps Megatron's attention otherwise (the CPU default
    stays Megatron's local attention); an explicit path that cannot work here raises ValueError naming the flag.
    """
    requested = requested or "auto"
    if requested not in CHOICES:
        raise ValueError(f"{FLAG} {requested!r}: choose one of {', '.join(CHOICES)}")
    if requested == "off":
        return None
    explicit = requested != "auto"
    why_not = None
    if transformer_engine:
        why_not = "Transformer Engine is installed and its attention is used"
    elif own_spec:
        why_not = "this model family builds its own layer spec with its own attention (GLM-5's DSA)"
    elif softmax_type != "vanilla":
        why_not = f"softmax_type {softmax_type!r} (softmax offsets/sinks) has no torch attention path here"
    elif requested == "varlen" and not cuda:
        why_not = "varlen_attn is Flash Attention, CUDA only"
    elif requested in ("varlen", "flex") and dropout > 0:
        why_not = f"attention dropout {dropout} runs only on the sdpa path"
    if why_not is not None:
        if explicit:
            raise ValueError(f"{FLAG} {requested}: {why_not}; use auto or off")
        return None
    if explicit:
        return requested
    if not cuda:
        return None  # the CPU keeps Megatron's local attention unless a path is asked for
    return "sdpa" if dropout > 0 else "varlen"


def runnable_path(path: str, query: torch.Tensor, value: torch.Tensor, dropout: float) -> str:
    """The first path from `path` on (varlen -> flex -> sdpa) that can run this call exactly."""
    if path == "varlen":
        flash = query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and query.shape[-1] == value.shape[-1]
        if flash and dropout == 0 and _has_varlen():
            return "varlen"
        path = "flex"
    if path == "flex":
        # torch has no flex_attention backward on the CPU; dropout has no flex form.
        if dropout == 0 and (query.is_cuda or not (torch.is_grad_enabled() and query.requires_grad)):
            return "flex"
    return "sdpa"


def _has_varlen() -> bool:
    """torch.nn.attention.varlen exists (torch 2.9+)."""
    return importlib.util.find_spec("torch.nn.attention.varlen") is not None


def layer_window(config: Any, layer_number: int) -> int | None:
    """The sliding window (keys behind the query) of this layer, or None for full causal attention."""
    from megatron.core.transformer.utils import is_layer_window_attention

    if not is_layer_window_attention(config.window_size, config.window_attn_skip_freq, layer_number):
        return None
    left, right = config.window_size
    if right != 0:
        raise ValueError(f"window_size {tuple(config.window_size)}: torch attention runs causal windows (W, 0) only")
    return None if left < 0 else int(left)


def document_block_mask(cu_seqlens: torch.Tensor, total: int, window: int | None, block: int = _FLEX_BLOCK):
    """flex_attention's BlockMask of causal attention within each [cu[i], cu[i+1]) (and a window), from block
    bounds: O(T + (T/block)^2) work, never the [T, T] mask."""
    from torch.nn.attention.flex_attention import BlockMask

    device = cu_seqlens.device
    cu = cu_seqlens.to(torch.int64)
    n = -(-total // block)
    pos = torch.arange(n * block, device=device)
    doc = torch.bucketize(pos, cu[1:], right=True)  # sequence of each position
    lo = cu[doc.clamp(max=cu.numel() - 2)]  # first key each query may see
    lo = torch.where(pos < total, lo, pos)  # block padding past T: only itself
    if window is not None:
        lo = torch.maximum(lo, pos - window)
    starts = torch.arange(n, device=device) * block
    q_first, q_last = starts[:, None], (starts + block).clamp(max=total)[:, None] - 1
    k_first, k_last = starts[None, :], (starts + block).clamp(max=total)[None, :] - 1
    # lo is non-decreasing, so the block's earliest query that reaches k_first decides "any", its last "full".
    q_star = torch.maximum(q_first, k_first)
    any_ = (q_star <= q_last) & (lo[q_star.clamp(max=n * block - 1)] <= k_last)
    whole = starts + block <= total  # as create_block_mask: a block cut by the end is never full
    full = (lo[q_last] <= k_first) & (q_first >= k_last) & whole[:, None] & whole[None, :]
    partial = any_ & ~full

    def indices(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Kept block columns first, in index order: argsort of (not kept, column).
        order = torch.argsort((~keep).to(torch.int64) * n + torch.arange(n, device=device), dim=1)
        return keep.sum(1).to(torch.int32)[None, None], order.to(torch.int32)[None, None]

    lo_q = torch.cat([lo, torch.full((1,), n * block, device=device)])  # index n*block: sees nothing
    edge = n * block

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (kv_idx >= lo_q[torch.clamp(q_idx, max=edge)])

    kv_num, kv_idx = indices(partial)
    full_num, full_idx = indices(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, block, mask_mod, seq_lengths=(total, total))


_compiled_flex = None


def _flex(query, key, value, block_mask, scale: float, gqa: bool) -> torch.Tensor:
    """flex_attention: compiled on CUDA (the fused kernel), eager on the CPU (compiling costs seconds per shape)."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if query.is_cuda:
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention)
        return _compiled_flex(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=gqa)
    return flex_attention(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=gqa)


def _window_mask(length: int, window: int, device: torch.device) -> torch.Tensor:
    """[L, L] bool, True = attend: causal within `window` keys back (SDPA has no window argument)."""
    i = torch.arange(length, device=device)
    distance = i[:, None] - i[None, :]
    return (distance >= 0) & (distance <= window)


def _sdpa(query, key, value, scale: float, gqa: bool, dropout: float, causal: bool, mask=None) -> torch.Tensor:
    """SDPA over [B, H, S, D] with a bool keep-mask, else causal or full attention."""
    causal = causal and mask is None
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, is_causal=causal, scale=scale, enable_gqa=gqa
    )


# Every layer of one forward gets the same cu_seqlens tensor: its boundaries (one device sync) and block masks
# are made once per micro-batch. Entries hold that tensor, so an `is` match cannot be a recycled id.
_PER_MICRO_BATCH: dict[tuple, tuple[torch.Tensor, Any]] = {}


def _once_per_micro_batch(kind: str, cu_seqlens: torch.Tensor, total: int, window: int | None, build) -> Any:
    key = (kind, total, window)
    hit = _PER_MICRO_BATCH.get(key)
    if hit is not None and hit[0] is cu_seqlens:
        return hit[1]
    if len(_PER_MICRO_BATCH) >= 8:
        _PER_MICRO_BATCH.clear()
    value = build()
    _PER_MICRO_BATCH[key] = (cu_seqlens, value)
    return value


def _boundaries(cu_seqlens: torch.Tensor, total: int) -> tuple[list[int], torch.Tensor]:
    """The sequences' bounds as a list and an int32 tensor; rows past the last bound form one more sequence
    (varlen would leave them uninitialised)."""
    bounds = cu_seqlens.tolist()
    if bounds[-1] < total:
        bounds.append(total)
    return bounds, torch.tensor(bounds, dtype=torch.int32, device=cu_seqlens.device)


def thd_attention(
    path: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    window: int | None = None,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, str]:
    """Causal attention within each packed sequence of [T, H, D] q/k/v; ([T, H, Dv], the path that ran)."""
    path = runnable_path(path, query, value, dropout)
    gqa = query.shape[1] != key.shape[1]
    total = query.shape[0]
    bounds, cu = _once_per_micro_batch("bounds", cu_seqlens, total, None, lambda: _boundaries(cu_seqlens, total))
    if path == "varlen":
        from torch.nn.attention.varlen import varlen_attn

        longest = max(b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True))
        win = (-1, 0) if window is None else (window, 0)
        out = varlen_attn(query, key, value, cu, cu, longest, longest, scale=scale, window_size=win, enable_gqa=gqa)
        return out, path
    q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (query, key, value))  # [1, H, T, D]
    if path == "flex":
        mask = _once_per_micro_batch("flex", cu_seqlens, total, window, lambda: document_block_mask(cu, total, window))
        out = _flex(q, k, v, mask, scale, gqa)
    else:
        pieces = []
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            mask = None if window is None or b == a else _window_mask(b - a, window, q.device)  # this sequence's
            pieces.append(_sdpa(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], scale, gqa, dropout, True, mask))
        out = torch.cat(pieces, dim=2)
    return out.squeeze(0).transpose(0, 1), path


def sbhd_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    causal: bool,
    scale: float,
    window: int | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """SDPA over [S, B, H, D] q/k/v (Megatron's bool mask: True = masked out); returns [S, B, H, Dv]."""
    q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))  # [B, H, S, D]
    gqa = q.shape[1] != k.shape[1]
    keep = None if attention_mask is None else ~attention_mask
    if window is not None:  # narrows any given mask (Megatron's local attention replaces the mask by the window)
        windowed = _window_mask(q.shape[-2], window, q.device)
        keep = windowed if keep is None else keep & windowed
    out = _sdpa(q, k, v, scale, gqa, dropout, causal, keep)
    return out.permute(2, 0, 1, 3)


def torch_core_attention(path: str) -> type:
    """A core-attention class for a layer spec running `path` (Attention calls the spec's class directly)."""
    from megatron.core import tensor_parallel
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.module import MegatronModule

    class TorchDotProductAttention(MegatronModule):
        """Megatron core attention computed by torch (varlen / flex / SDPA), THD and SBHD inputs."""

        attention_path = path

        def __init__(
            self,
            config,
            layer_number: int,
            attn_mask_type,
            attention_type: str,
            attention_dropout: float | None = None,
            softmax_scale: float | None = None,
            cp_comm_type: str | None = None,
            pg_collection=None,
            k_channels: int | None = None,
            v_channels: int | None = None,
        ) -> None:
            MegatronModule.__init__(self, config=config)
            if config.context_parallel_size != 1:
                raise ValueError("torch attention runs without context parallelism (Transformer Engine has it)")
            self.layer_number = max(1, layer_number)
            self.attn_mask_type = attn_mask_type
            head = k_channels or config.kv_channels
            # Megatron's query-key layer scaling divides its scale by the layer number and its softmax multiplies
            # the scores back: the net scale is this one.
            self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head)
            self.window = layer_window(config, self.layer_number)
            self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
            self.last_path: str | None = None

        def forward(
            self,
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            attention_mask: torch.Tensor | None,
            attn_mask_type=None,
            attention_bias: torch.Tensor | None = None,
            packed_seq_params=None,
        ) -> torch.Tensor:
            """[S, B, H*Dv] for [S, B, H, D] inputs; [T, 1, H*Dv] for THD ([T, H, D]) with packed_seq_params."""
            if attention_bias is not None:
                raise ValueError("torch attention takes no attention_bias")
            dropout = self.dropout if self.training else 0.0
            rng = tensor_parallel.get_cuda_rng_tracker().fork() if dropout > 0 else contextlib.nullcontext()
            with rng:
                if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
                    cu = packed_seq_params.cu_seqlens_q_padded
                    cu = packed_seq_params.cu_seqlens_q if cu is None else cu  # the layout's boundaries
                    out, self.last_path = thd_attention(
                        self.attention_path, query, key, value, cu, self.softmax_scale, self.window, dropout
                    )
                    return out.reshape(out.shape[0], 1, -1)
                mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
                causal = mask_type in (AttnMaskType.causal, AttnMaskType.padding_causal)
                out = sbhd_attention(
                    query, key, value, attention_mask, causal, self.softmax_scale, self.window, dropout
                )
                self.last_path = "sdpa"
                return out.reshape(out.shape[0], out.shape[1], -1)

    return TorchDotProductAttention


def use_torch_attention(spec: Any, path: str) -> Any:
    """Swap Megatron's local core attention (plain and MLA) for torch's in a decoder block spec, in place."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    plain = torch_core_attention(path)
    for layer in spec.layer_specs:
        attention = getattr(layer.submodules, "self_attention", None)
        submodules = getattr(attention, "submodules", None)
        core = getattr(submodules, "core_attention", None)
        # Only Megatron's own local attention (and the MLA subclass of it): DSA and others keep theirs.
        if isinstance(core, type) and issubclass(core, DotProductAttention):
            submodules.core_attention = plain
    return spec


def attention_paths(model: Any) -> list[str]:
    """The torch paths the model's core attentions ran in their last forward (empty: Megatron's attention)."""
    chunks = model if isinstance(model, list | tuple) else [model]
    found = {m.last_path for c in chunks for m in c.modules() if getattr(m, "attention_path", None) and m.last_path}
    return sorted(found)
