"""slime.utils.types: slime's `Sample`, our core Sample with slime's extra fields and helpers.

Its extra fields are keyword-only and follow ours. The plugin loader makes every sample the rollout serves one
of these once a slime plugin is loaded (slime_like.core.plugin_loader.use_slime_samples); our own code reads only
the core fields, and slime's fields that change training are translated at the edge (`remove_sample`:
rollout/slime_contract.exclude_removed_samples).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from slime_like.core.sample import ROUTED_EXPERTS_KEY, Status, decode_routed_experts
from slime_like.core.sample import Sample as CoreSample

# A trainer-side batch in slime: column name -> one entry per sample.
RolloutBatch = dict[str, list[Any]]

# SGLang's finish_reason["type"] -> the status it means (slime's mapping; "abort" may also be a rejection).
FINISH_REASON_STATUS = {"length": Status.TRUNCATED, "abort": Status.ABORTED, "stop": Status.COMPLETED}


@dataclass
class _MetaInfoCounts:
    """Counts summed over a sample's /generate answers: each field adds its meta_info key (META_KEYS, else its
    own name)."""

    META_KEYS: ClassVar[dict[str, str]] = {}

    def add(self, meta_info: dict[str, Any]) -> None:
        """Add one answer's meta_info counts."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + meta_info.get(self.META_KEYS.get(f.name, f.name), 0))

    def to_dict(self) -> dict[str, int]:
        """The counts."""
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict[str, int]) -> Any:
        """Inverse of `to_dict` (missing counts are 0)."""
        return cls(**{f.name: d.get(f.name, 0) for f in fields(cls)})


@dataclass
class SpecInfo(_MetaInfoCounts):
    """Speculative-decoding counts summed over a sample's /generate answers (slime's Sample.SpecInfo)."""

    META_KEYS: ClassVar[dict[str, str]] = {"completion_token_num": "completion_tokens"}

    spec_accept_token_num: int = 0
    spec_draft_token_num: int = 0
    spec_verify_ct: int = 0
    completion_token_num: int = 0

    @property
    def spec_accept_rate(self) -> float:
        """Accepted over drafted tokens (0 without drafts)."""
        return self.spec_accept_token_num / self.spec_draft_token_num if self.spec_draft_token_num else 0.0

    @property
    def spec_accept_length(self) -> float:
        """Completion tokens per verification step (0 without steps)."""
        return self.completion_token_num / self.spec_verify_ct if self.spec_verify_ct else 0.0


@dataclass
class PrefixCacheInfo(_MetaInfoCounts):
    """Prompt tokens served from SGLang's prefix cache, summed over a sample's answers (slime's)."""

    META_KEYS: ClassVar[dict[str, str]] = {"total_prompt_tokens": "prompt_tokens"}

    cached_tokens: int = 0
    total_prompt_tokens: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Cached over prompt tokens (0 without prompt tokens)."""
        return self.cached_tokens / self.total_prompt_tokens if self.total_prompt_tokens else 0.0


@dataclass
class Sample(CoreSample):
    """slime's Sample: ours plus slime's fields (keyword-only, slime's defaults), `Sample.Status` and helpers."""

    Status: ClassVar[type[Status]] = Status  # slime's spelling: Sample.Status.COMPLETED
    SpecInfo: ClassVar[type[SpecInfo]] = SpecInfo
    PrefixCacheInfo: ClassVar[type[PrefixCacheInfo]] = PrefixCacheInfo

    rollout_id: int | None = field(default=None, kw_only=True)  # siblings a generate function fanned out share it
    # Trained with loss mask 0, still counted in group statistics (rollout/slime_contract.exclude_removed_samples).
    remove_sample: bool = field(default=False, kw_only=True)
    weight_versions: list[str] = field(default_factory=list, kw_only=True)
    # multimodal_inputs and multimodal_train_inputs are our Sample's (slime_like/core/sample.py).
    multimodal_train_input_id: str | None = field(default=None, kw_only=True)
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict, kw_only=True)
    rollout_top_p_token_ids: Any = field(default=None, kw_only=True)
    rollout_top_p_token_offsets: Any = field(default=None, kw_only=True)
    generate_function_path: str | None = field(default=None, kw_only=True)
    custom_rm_path: str | None = field(default=None, kw_only=True)
    train_metadata: dict[str, Any] | None = field(default=None, kw_only=True)
    session_id: str | None = field(default=None, kw_only=True)
    non_generation_time: float = field(default=0.0, kw_only=True)
    spec_info: SpecInfo = field(default_factory=SpecInfo, kw_only=True)
    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo, kw_only=True)

    def reset(self, metadata: dict[str, Any]) -> None:
        """Ours, and slime's per-generation fields."""
        super().reset(metadata)
        self.remove_sample, self.weight_versions = False, []

    def to_dict(self) -> dict[str, Any]:
        """Ours, with slime's counts as dicts."""
        d = super().to_dict()
        d["spec_info"] = self.spec_info.to_dict()
        d["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sample:
        """Inverse of `to_dict`; keys that are not fields become attributes."""
        d = dict(d)
        d["spec_info"] = SpecInfo.from_dict(d.get("spec_info") or {})
        d["prefix_cache_info"] = PrefixCacheInfo.from_dict(d.get("prefix_cache_info") or {})
        return super().from_dict(d)

    def get_reward_value(self, args: Any) -> Any:
        """slime's reward read: the reward itself, or its `args.reward_key` entry when that flag is set."""
        key = getattr(args, "reward_key", None)
        return self.reward[key] if key else self.reward

    def append_response_tokens(
        self,
        args: Any = None,
        *,
        tokens: Any = None,
        log_probs: Any = None,
        trainable: bool = True,
        meta_info: dict[str, Any] | None = None,
        text: str | None = None,
        update_terminal_info: bool = True,
    ) -> None:
        """slime's helper: append response tokens (loss mask 1, their log-probs, meta_info's weight versions and
        routed experts if trainable, else 0, 0.0 and version -1)."""
        new = [int(t) for t in (tokens.tolist() if hasattr(tokens, "tolist") else tokens or [])]
        lps = (
            None
            if log_probs is None
            else [float(x) for x in (log_probs.tolist() if hasattr(log_probs, "tolist") else log_probs)]
        )
        if lps is not None and len(lps) != len(new):
            raise ValueError(f"append_response_tokens: {len(lps)} log-probs for {len(new)} tokens")
        if trainable and lps is None and new:
            raise ValueError("append_response_tokens: trainable tokens need their log_probs")
        # slime raises for any log-probs here; its own examples/geo3k_vlm_multi_turn/rollout.py passes zeros for the
        # environment's tokens, the values they get anyway, so zeros are taken.
        if not trainable and lps is not None and any(lps):
            raise ValueError("append_response_tokens: non-trainable tokens take no log_probs (they get 0.0)")
        if text is not None:
            self.response += text
        if new:
            before = self.response_length
            if self.loss_mask is None:
                self.loss_mask = [1] * before
            if self.rollout_log_probs is None:
                if trainable and before:
                    raise ValueError("append_response_tokens: earlier response tokens have no log-probs")
                self.rollout_log_probs = [0.0] * before
            # In place, as slime's `+=`: plugins hold `sample.loss_mask` (or `tokens`) while they append turns.
            if not isinstance(self.tokens, list):  # a tuple or tensor from a plugin: `+=` would not extend it
                self.tokens = [int(t) for t in self.tokens]
            self.tokens += new
            self.response_length += len(new)
            self.loss_mask += [1 if trainable else 0] * len(new)
            self.rollout_log_probs += lps if trainable else [0.0] * len(new)
            self.add_version_spans(len(new), meta_info if trainable else None)
        if meta_info is not None and meta_info.get(ROUTED_EXPERTS_KEY) is not None and new and trainable:
            # R3: an answer's routed experts cover the whole sequence it was asked for (SGLang's default start 0),
            # so they replace those of an earlier, partial request.
            if getattr(args, "num_layers", None) is None or getattr(args, "moe_router_topk", None) is None:
                raise ValueError("append_response_tokens: routed experts need args with num_layers and moe_router_topk")
            self.rollout_routed_experts = decode_routed_experts(
                meta_info[ROUTED_EXPERTS_KEY], len(self.tokens) - 1, args.num_layers, args.moe_router_topk
            )
        if meta_info is not None and update_terminal_info and "finish_reason" in meta_info:
            self._apply_terminal_info(args, meta_info)
        self._validate_response_metadata_lengths()

    def _apply_terminal_info(self, args: Any, meta_info: dict[str, Any]) -> None:
        """A final /generate answer's status, weight version and cache/speculation counts (no top-p replay)."""
        if getattr(args, "sglang_speculative_algorithm", None):
            self.spec_info.add(meta_info)
        self.prefix_cache_info.add(meta_info)
        version = meta_info.get("weight_version")
        if version is not None:
            self.weight_versions.append(str(version))
            self.weight_version = int(version) if str(version).isdigit() else self.weight_version
        reason = (meta_info.get("finish_reason") or {}).get("type")
        if reason in FINISH_REASON_STATUS:
            self.status = FINISH_REASON_STATUS[reason]

    def _validate_response_metadata_lengths(self) -> None:
        """Loss mask and rollout log-probs cover exactly the response tokens."""
        for name in ("loss_mask", "rollout_log_probs"):
            value = getattr(self, name)
            if value is not None and len(value) != self.response_length:
                raise ValueError(
                    f"sample {self.index}: {name} has {len(value)} entries for {self.response_length} response tokens"
                )


__all__ = ["FINISH_REASON_STATUS", "PrefixCacheInfo", "RolloutBatch", "Sample", "SpecInfo", "Status"]
