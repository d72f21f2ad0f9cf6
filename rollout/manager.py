"""The rollout side of a run: SGLang servers behind one router, the data buffer, generation and rewards."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp

from buffer.buffer import Buffer
from buffer.data_source import DataSource, PromptDataset
from rollout.generate import RolloutContext, generate, sampling_params_from_args
from rollout.metrics import rollout_metrics
from rollout.rewards import get_reward_function, score_sample
from slime_like.plugin_loader import load_plugin
from slime_like.sample import Sample

logger = logging.getLogger(__name__)

GenerateFn = Callable[[RolloutContext, Sample, dict[str, Any]], Awaitable[Sample]]


def load_dataset(args: Any, path: str, tokenizer: Any) -> PromptDataset:
    """A prompt dataset configured by the data flags."""
    return PromptDataset(
        path,
        input_key=args.input_key,
        label_key=args.label_key,
        metadata_key=args.metadata_key,
        tokenizer=tokenizer,
        apply_chat_template=args.apply_chat_template,
        max_prompt_len=args.rollout_max_prompt_len,
        skip_bad_rows=args.skip_bad_rows,
    )


class RolloutManager:
    """Owns the servers, the router and the buffer; `generate` returns one rollout's finished groups."""

    def __init__(self, args: Any, gpu_offset: int = 0) -> None:
        from transformers import AutoTokenizer

        self.args = args
        # Plugins and data load first, so their errors come before any server starts.
        self.generate_fn: GenerateFn = (
            load_plugin(args.custom_generate_function_path, "--custom-generate-function-path", params=3, is_async=True)
            if args.custom_generate_function_path
            else generate
        )
        self.reward_fn = get_reward_function(args.rm_type, args.custom_rm_path)
        self.tokenizer = AutoTokenizer.from_pretrained(args.hf_checkpoint)
        dataset = load_dataset(args, args.prompt_data, self.tokenizer)
        self.data_skipped = dict(dataset.skipped)
        self.buffer = Buffer(
            DataSource(dataset, args.n_samples_per_prompt, shuffle=args.rollout_shuffle, seed=args.rollout_seed)
        )
        self.eval_dataset = load_dataset(args, args.eval_prompt_data, self.tokenizer) if args.eval_prompt_data else None
        self.servers: list[Any] = []
        self.router: Any = None
        # Our own event loop thread: the caller (a Ray actor) may already be running one.
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="rollout-loop", daemon=True).start()
        self._start_servers(gpu_offset)

    def _start_servers(self, gpu_offset: int) -> None:
        from rollout.router import SGLangRouter
        from rollout.sglang_server import SGLangServer

        tp = self.args.rollout_num_gpus_per_engine
        log_dir = Path(self.args.output_dir) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        n = max(1, self.args.rollout_num_gpus // tp)
        self.servers = [
            SGLangServer(
                self.args.hf_checkpoint,
                extra_args=[*self.args.sglang_server_args, *self._gpu_args(gpu_offset + i * tp, tp)],
                startup_timeout=self.args.sglang_startup_timeout,
                log_dir=log_dir,
            )
            for i in range(n)
        ]
        try:
            with ThreadPoolExecutor(max_workers=n) as pool:
                list(pool.map(lambda s: s.start(), self.servers))
            self.router = SGLangRouter([s.url for s in self.servers], log_dir=log_dir)
            self.router.start()
        except BaseException:
            self.shutdown()
            raise
        self.set_weight_version(0)

    @staticmethod
    def _gpu_args(base_gpu_id: int, tp: int) -> list[str]:
        import torch

        return ["--tp-size", str(tp), "--base-gpu-id", str(base_gpu_id)] if torch.cuda.is_available() else []

    def server_urls(self) -> list[str]:
        """Base URLs of the SGLang servers (for weight updates)."""
        return [s.url for s in self.servers]

    def set_weight_version(self, version: int) -> None:
        """Tag the servers' current weights (samples record it)."""
        from slime_like.weights.server_calls import on_all, post

        on_all(
            self.server_urls(),
            post,
            "/update_weight_version",
            {"new_version": str(version), "abort_all_requests": False},
        )

    def generate(self, rollout_id: int) -> tuple[list[list[Sample]], dict[str, Any]]:
        """Generate and score `--rollout-batch-size` groups; returns them with metrics."""
        start = time.monotonic()
        groups = self.buffer.get_groups(self.args.rollout_batch_size)
        counters = self._run(self._run_groups(groups, sampling_params_from_args(self.args)))
        metrics = rollout_metrics(groups, self.args.reward_key)
        elapsed = time.monotonic() - start
        metrics.update({f"rollout/{k}": v for k, v in counters.items()})
        metrics["rollout/time"] = elapsed
        metrics["rollout/tokens_per_s"] = metrics["rollout/generated_tokens"] / max(elapsed, 1e-9)
        metrics.update({f"data/skipped_{k}": v for k, v in self.data_skipped.items()})
        self._dump(f"rollout_{rollout_id:06d}", groups)
        return groups, metrics

    def evaluate(self, rollout_id: int) -> dict[str, Any]:
        """Greedy (by default) generation over the whole eval set; mean reward per dataset."""
        if self.eval_dataset is None:
            return {}
        params = sampling_params_from_args(self.args)
        params["temperature"] = self.args.eval_temperature
        if self.args.eval_max_response_len:
            params["max_new_tokens"] = self.args.eval_max_response_len
        source = DataSource(self.eval_dataset, 1, shuffle=False)
        groups = source.get_groups(len(self.eval_dataset))
        start = time.monotonic()
        self._run(self._run_groups(groups, params))
        metrics = rollout_metrics(groups, self.args.reward_key, prefix="eval")
        metrics["eval/time"] = time.monotonic() - start
        self._dump(f"eval_{rollout_id:06d}", groups)
        return metrics

    def _dump(self, name: str, groups: list[list[Sample]]) -> None:
        """With --save-debug-rollout-data, keep every sample of this rollout (or eval) as jsonl."""
        if not self.args.save_debug_rollout_data:
            return
        target = Path(self.args.output_dir) / "rollouts"
        target.mkdir(parents=True, exist_ok=True)
        with (target / f"{name}.jsonl").open("w") as f:
            f.writelines(json.dumps(s.to_dict()) + "\n" for g in groups for s in g)

    def _run(self, coro: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _run_groups(self, groups: list[list[Sample]], params: dict[str, Any]) -> dict[str, int]:
        concurrency = self.args.sglang_server_concurrency * len(self.servers)
        timeout = aiohttp.ClientTimeout(total=self.args.rollout_request_timeout)
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            ctx = RolloutContext(self.args, self.tokenizer, self.router.url, session, asyncio.Semaphore(concurrency))
            await asyncio.gather(*(self._run_sample(ctx, s, params) for g in groups for s in g))
        return ctx.counters

    async def _run_sample(self, ctx: RolloutContext, sample: Sample, params: dict[str, Any]) -> None:
        out = await self.generate_fn(ctx, sample, params)
        if out is not sample:
            raise TypeError("--custom-generate-function-path must return the Sample it was given, updated")
        if sample.response_length == 0 and sample.status.value == "failed":
            ctx.count("generate_failed")
            sample.reward = 0.0
            return
        if not await score_sample(self.reward_fn, self.args, sample):
            ctx.count("reward_failed")

    def release_memory(self) -> None:
        """Colocated on GPU: free the servers' weights and KV cache while the trainer runs."""
        from slime_like.weights.server_calls import on_all, post

        on_all(self.server_urls(), post, "/release_memory_occupation", {})

    def resume_memory(self) -> None:
        """Colocated on GPU: take the memory back before weights are updated and generation resumes."""
        from slime_like.weights.server_calls import on_all, post

        on_all(self.server_urls(), post, "/resume_memory_occupation", {})

    def state_dict(self) -> dict[str, Any]:
        """The buffer's state, saved with the checkpoint."""
        return self.buffer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the buffer's state."""
        self.buffer.load_state_dict(state)

    def shutdown(self) -> None:
        """Stop the router and every server."""
        if self.router is not None:
            self.router.stop()
        for server in self.servers:
            server.stop()
