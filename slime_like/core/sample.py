"""The Sample type shared by rollout, buffer and training.

It also carries slime's field names and helpers (`Sample.Status`, `append_response_tokens`,
`get_reward_value`, ...), so plugins written for slime's `slime.utils.types.Sample` use this very type
(docs/plugins.md, "Plugins written for slime"). slime's extra fields are keyword-only and come after ours.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar


class Status(enum.StrEnum):
    """Lifecycle of one generated sample."""

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


# SGLang's finish_reason["type"] -> the status it means (slime's mapping; "abort" may also be a rejection).
FINISH_REASON_STATUS = {"length": Status.TRUNCATED, "abort": Status.ABORTED, "stop": Status.COMPLETED}
# meta_info key of a streamed /generate answer (rollout.sglang_client.read_stream): [[version, tokens], ...] over
# its output tokens, each version as the server reported it.
VERSION_SPANS_KEY = "weight_version_spans"
NO_VERSION = -1  # a version span's version for tokens no known weight version generated
# meta_info key of a /generate answer asked for `return_routed_experts` (R3): base64 of int32 [tokens - 1, layers,
# topk], the experts every token of the sequence but the last (never fed to the model) was routed to.
ROUTED_EXPERTS_KEY = "routed_experts"


def decode_routed_experts(encoded: Any, rows: int, num_layers: int, topk: int) -> Any:
    """SGLang's routed experts (base64 or raw int32) as a numpy int32 array [rows, num_layers, topk]."""
    import base64

    import numpy as np

    raw = base64.b64decode(encoded) if isinstance(encoded, str) else encoded
    flat = np.frombuffer(raw, dtype=np.int32) if isinstance(raw, bytes | bytearray) else np.asarray(raw, np.int32)
    if flat.size != rows * num_layers * topk:
        raise ValueError(
            f"SGLang returned {flat.size} routed-expert ids; {rows} tokens x {num_layers} layers x top-{topk} need "
            f"{rows * num_layers * topk} (are --num-layers / --moe-router-topk the served model's?)"
        )
    return flat.reshape(rows, num_layers, topk).copy()  # frombuffer is read-only


def version_number(version: Any) -> int:
    """A weight version as SGLang reports it (a string) as an int; NO_VERSION when it is not a number."""
    text = str(version) if version is not None else ""
    return int(text) if text.isdigit() else NO_VERSION


@dataclass
class SpecInfo:
    """Speculative-decoding counts summed over a sample's /generate answers (slime's Sample.SpecInfo)."""

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

    def add(self, meta_info: dict[str, Any]) -> None:
        """Add one answer's meta_info counts."""
        self.spec_accept_token_num += meta_info.get("spec_accept_token_num", 0)
        self.spec_draft_token_num += meta_info.get("spec_draft_token_num", 0)
        self.spec_verify_ct += meta_info.get("spec_verify_ct", 0)
        self.completion_token_num += meta_info.get("completion_tokens", 0)

    def to_dict(self) -> dict[str, int]:
        """The four counts."""
        return dict(self.__dict__)

    @staticmethod
    def from_dict(d: dict[str, int]) -> SpecInfo:
        """Inverse of `to_dict` (missing counts are 0)."""
        return SpecInfo(**{f.name: d.get(f.name, 0) for f in fields(SpecInfo)})


@dataclass
class PrefixCacheInfo:
    """Prompt tokens served from SGLang's prefix cache, summed over a sample's answers (slime's)."""

    cached_tokens: int = 0
    total_prompt_tokens: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Cached over prompt tokens (0 without prompt tokens)."""
        return self.cached_tokens / self.total_prompt_tokens if self.total_prompt_tokens else 0.0

    def add(self, meta_info: dict[str, Any]) -> None:
        """Add one answer's meta_info counts."""
        self.cached_tokens += meta_info.get("cached_tokens", 0)
        self.total_prompt_tokens += meta_info.get("prompt_tokens", 0)

    def to_dict(self) -> dict[str, int]:
        """The two counts."""
        return dict(self.__dict__)

    @staticmethod
    def from_dict(d: dict[str, int]) -> PrefixCacheInfo:
        """Inverse of `to_dict` (missing counts are 0)."""
        return PrefixCacheInfo(**{f.name: d.get(f.name, 0) for f in fields(PrefixCacheInfo)})


@dataclass
class Sample:
    """One prompt and (after rollout) one response with its tokens, log-probs and reward."""

    Status: ClassVar[type[Status]] = Status  # slime's spelling: Sample.Status.COMPLETED
    SpecInfo: ClassVar[type[SpecInfo]] = SpecInfo
    PrefixCacheInfo: ClassVar[type[PrefixCacheInfo]] = PrefixCacheInfo

    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = field(default_factory=list)  # prompt tokens followed by response tokens
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None  # one entry per response token
    rollout_log_probs: list[float] | None = None  # one entry per response token
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    group_index: int | None = None
    index: int | None = None
    weight_version: int | None = None  # the version of the last answer's weights when it finished
    # [[weight_version, n_tokens], ...] in response order, over every response token: which weights generated each
    # stretch. A request that spans weight updates (--pause-generation-mode retract/in_place) gives one per version.
    # Version -1 (NO_VERSION): no weights generated them (tool or environment tokens, loss mask 0), or they came
    # without a numeric version. Filled by rollout.generate.append_model_tokens and append_response_tokens; a
    # generate function that appends tokens itself may leave them uncovered.
    version_spans: list[list[int]] = field(default_factory=list, kw_only=True)
    # slime's fields (keyword-only). remove_sample: trained with loss mask 0, still counted in group statistics.
    rollout_id: int | None = field(default=None, kw_only=True)  # siblings a generate function fanned out share it
    remove_sample: bool = field(default=False, kw_only=True)
    weight_versions: list[str] = field(default_factory=list, kw_only=True)
    teacher_log_probs: list[float] | None = field(default=None, kw_only=True)
    multimodal_inputs: dict[str, Any] | None = field(default=None, kw_only=True)
    multimodal_train_inputs: dict[str, Any] | None = field(default=None, kw_only=True)
    multimodal_train_input_id: str | None = field(default=None, kw_only=True)
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict, kw_only=True)
    rollout_top_p_token_ids: Any = field(default=None, kw_only=True)
    rollout_top_p_token_offsets: Any = field(default=None, kw_only=True)
    rollout_routed_experts: Any = field(default=None, kw_only=True)
    generate_function_path: str | None = field(default=None, kw_only=True)
    custom_rm_path: str | None = field(default=None, kw_only=True)
    train_metadata: dict[str, Any] | None = field(default=None, kw_only=True)
    session_id: str | None = field(default=None, kw_only=True)
    non_generation_time: float = field(default=0.0, kw_only=True)
    spec_info: SpecInfo = field(default_factory=SpecInfo, kw_only=True)
    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo, kw_only=True)

    @property
    def prompt_length(self) -> int:
        """Number of prompt tokens at the front of `tokens`."""
        return len(self.tokens) - self.response_length

    @property
    def effective_response_length(self) -> int:
        """Response tokens the loss sees: sum of the loss mask (the response length without a mask)."""
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

    def oldest_version(self) -> int | None:
        """The oldest weight version that generated any response token (None: no span names a version)."""
        return min((v for v, n in self.version_spans if v != NO_VERSION and n > 0), default=None)

    def add_version_spans(self, n_tokens: int, meta_info: dict[str, Any] | None = None) -> None:
        """Extend `version_spans` over `n_tokens` response tokens just appended: from one /generate answer's
        meta_info (its streamed spans when they cover exactly these tokens, else its final weight version for all),
        or as NO_VERSION without one (tokens no model generated, or of unknown version)."""
        if n_tokens <= 0:
            return
        streamed = (meta_info or {}).get(VERSION_SPANS_KEY)
        if streamed and sum(n for _, n in streamed) == n_tokens:
            spans = [(version_number(v), int(n)) for v, n in streamed]
        elif meta_info is not None:
            spans = [(version_number(meta_info.get("weight_version")), n_tokens)]
        else:
            spans = [(NO_VERSION, n_tokens)]
        for version, n in spans:
            if self.version_spans and self.version_spans[-1][0] == version:
                self.version_spans[-1][1] += n
            elif n > 0:
                self.version_spans.append([version, n])

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (status as its string value); attributes set on the sample are included."""
        d = dict(self.__dict__)
        if hasattr(d["rollout_routed_experts"], "tolist"):  # an array (R3): nested lists for JSON
            d["rollout_routed_experts"] = d["rollout_routed_experts"].tolist()
        d["status"] = self.status.value
        d["spec_info"] = self.spec_info.to_dict()
        d["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sample:
        """Inverse of `to_dict`; keys that are not fields become attributes."""
        d = dict(d)
        d["status"] = Status(d.get("status", "pending"))
        d["spec_info"] = SpecInfo.from_dict(d.get("spec_info") or {})
        d["prefix_cache_info"] = PrefixCacheInfo.from_dict(d.get("prefix_cache_info") or {})
        names = {f.name for f in fields(cls)}
        sample = cls(**{k: v for k, v in d.items() if k in names})
        for key, value in d.items():
            if key not in names:
                setattr(sample, key, value)
        return sample

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
        if not trainable and lps is not None:
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


def scalar_reward(sample: Sample, reward_key: str | None = None) -> float:
    """The sample's reward as a float (dict rewards are read at `reward_key`)."""
    reward = sample.reward
    if isinstance(reward, dict):
        if reward_key is None:
            raise ValueError(f"sample {sample.index} has a dict reward {sorted(reward)}: set --reward-key")
        reward = reward[reward_key]
    return float(reward or 0.0)
