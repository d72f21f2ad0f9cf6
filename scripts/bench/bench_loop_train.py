"""bench_loop's train section: TrainActor.train on a rollout-sized batch vs a bare Megatron step, and its log-prob
phase vs a bare no-grad forward, in one process (a world of one)."""

from __future__ import annotations

import os
import time
from typing import Any

from bench_common import job_flags, median, prompt_rows


class TrainSection:
    """Section 3 of bench_loop's Bench: needs `args`, `work` and `model`, and sets `actor`."""

    args: Any
    work: Any
    model: Any
    actor: Any

    def make_actor(self) -> None:
        """A trainer rank in this process (a world of one), as the loop's Ray actor builds it."""
        from slime_like.arguments import parse_args as parse_run_args
        from slime_like.core.process import free_port
        from slime_like.trainer.actor import TrainActor

        run_args = parse_run_args(job_flags(self.model, self.work, self.args, self.args.max_response_len))
        saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        try:
            self.actor = TrainActor(run_args, 0, "127.0.0.1", free_port())
        finally:  # the process group exists now; children must not inherit a rank
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def train_data(self) -> Any:
        """A rollout's training data: the demo prompts, random responses, 0/1 rewards, rollout log-probs."""
        import torch

        from buffer.train_data import build_train_data
        from rollout.generate import prompt_token_ids
        from slime_like.core.sample import Sample, Status

        a = self.args
        gen = torch.Generator().manual_seed(0)
        tokenizer = self.actor_tokenizer()
        vocab = len(tokenizer)
        groups = []
        for g, row in enumerate(prompt_rows(self.work, a.rollout_batch_size)):
            prompt = prompt_token_ids(tokenizer, row["prompt"])
            group = []
            for k in range(a.n_samples_per_prompt):
                response = torch.randint(3, vocab, (a.max_response_len,), generator=gen).tolist()
                group.append(
                    Sample(
                        prompt=row["prompt"], tokens=prompt + response, response_length=len(response),
                        label=row["label"], reward=float(torch.rand((), generator=gen) < 0.5),
                        loss_mask=[1] * len(response), rollout_log_probs=[-6.0] * len(response),
                        status=Status.TRUNCATED, group_index=g, index=g * a.n_samples_per_prompt + k, weight_version=0,
                    )
                )  # fmt: skip
            groups.append(group)
        return build_train_data(groups)

    def actor_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.model)

    def train(self) -> dict[str, float]:
        """Section 3; returns the figures "train" (TrainActor's train time / bare Megatron step) and "logprob"
        (its log-prob phase / bare no-grad forward), each the median of per-repeat ratios."""
        import torch
        from megatron.core.distributed import finalize_model_grads

        from slime_like.trainer.megatron.cpu_compat import cuda_to_cpu
        from slime_like.trainer.megatron.packing import pack, split_micro_batches

        a = self.args
        print("\n== 3. Train step vs bare Megatron step (one process, a world of one) ==", flush=True)
        engine = self.actor.engine
        data = self.train_data()
        tokens = data.tokens
        lengths = [len(t) for t in tokens]
        n_loss = sum(sum(m) for m in data.loss_masks)
        # The micro-batches the engine packs (world of one), built once: the bare step does not pack.
        plan = split_micro_batches(range(len(tokens)), lengths, a.max_tokens_per_gpu)
        micro = [pack(tokens, ids) for ids in plan]
        targets = [torch.roll(mb.tokens, -1, dims=1) for mb in micro]
        masks = []
        for mb in micro:
            m = torch.zeros(mb.tokens.shape)
            for row, start, length, idx in zip(mb.rows, mb.starts, mb.lengths, mb.indices, strict=True):
                n = data.response_lengths[idx]
                m[row, start + length - 1 - n : start + length - 1] = 1.0  # positions that predict the response
            masks.append(m)
        print(
            f"batch: {len(tokens)} sequences, {sum(lengths)} tokens, {len(micro)} packed micro-batches of <= "
            f"{a.max_tokens_per_gpu} tokens, one optimizer step; {a.train_repeats} measured repeats per variant "
            "after 2 warm-ups, rotating order",
            flush=True,
        )
        chunk = engine.model[0]
        rollout_id = iter(range(10**6))
        actor_times: dict[str, list[float]] = {"time/logprob": [], "time/train": []}

        def actor_train() -> None:  # log-prob recompute + advantages + the optimizer step
            metrics = self.actor.train(next(rollout_id), data)
            for key, values in actor_times.items():
                values.append(metrics[key])

        def plain_loss(logprobs, items, **_):
            return -sum(lp[-n:].sum() for lp, n in zip(logprobs, items, strict=True)) / n_loss

        def engine_plain() -> None:  # the engine's train_step with the bare step's loss and no entropy
            engine.train_step(tokens, data.response_lengths, plain_loss)

        def bare_step() -> None:
            chunk.train()
            chunk.zero_grad_buffer()
            engine.optimizer.zero_grad()
            for mb, tgt, m in zip(micro, targets, masks, strict=True):
                logits = chunk(mb.tokens, mb.position_ids, mb.attention_mask)
                lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
                (-(lp * m).sum() / n_loss).backward()
            finalize_model_grads([chunk])
            with cuda_to_cpu():
                engine.optimizer.step()

        def engine_forward() -> None:
            engine.forward_logprobs(tokens)

        def bare_forward() -> None:
            chunk.eval()
            with torch.no_grad():
                for mb, tgt in zip(micro, targets, strict=True):
                    logits = chunk(mb.tokens, mb.position_ids, mb.attention_mask)
                    torch.log_softmax(logits.float(), dim=-1).gather(-1, tgt.unsqueeze(-1))

        variants = {
            "TrainActor.train (whole)": actor_train,
            "engine.train_step, plain loss": engine_plain,
            "bare Megatron step": bare_step,
            "engine.forward_logprobs": engine_forward,
            "bare no-grad forward": bare_forward,
        }
        names = list(variants)
        times: dict[str, list[float]] = {k: [] for k in names}
        for rep in range(a.train_repeats + 2):
            if rep == 2:
                for values in actor_times.values():
                    values.clear()
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                start = time.perf_counter()
                variants[name]()
                if rep >= 2:
                    times[name].append(time.perf_counter() - start)
        med = {k: median(v) for k, v in times.items()}
        med["  of which time/logprob"] = median(actor_times["time/logprob"])
        med["  of which time/train"] = median(actor_times["time/train"])
        bare, bare_fwd = med["bare Megatron step"], med["bare no-grad forward"]
        order = [names[0], "  of which time/logprob", "  of which time/train", *names[1:]]
        refs = {
            "  of which time/logprob": bare_fwd,
            "engine.forward_logprobs": bare_fwd,
            "bare no-grad forward": bare_fwd,
        }
        for name in order:
            spread = f"[{min(times[name]) * 1e3:.0f}-{max(times[name]) * 1e3:.0f}]" if name in times else ""
            ref = refs.get(name, bare)
            rel = f"x{med[name] / ref:.3f} of bare {'forward' if ref is bare_fwd else 'step'}"
            if name == names[0]:
                rel = ""
            print(f"  {name:<32}{med[name] * 1e3:8.1f} ms {spread:>12}  {rel}")
        ratio = median([t / b for t, b in zip(actor_times["time/train"], times["bare Megatron step"], strict=True)])
        print(
            f"  TrainActor time/train (train_step with the project's loss and entropy) / bare step: median of "
            f"per-repeat ratios {ratio:.3f} (the figure; goal <= 1.10)"
        )
        print(
            f"  engine.train_step with the bare loss / bare step = {med[names[1]] / bare:.3f} (engine overhead alone)"
        )
        per_repeat = zip(actor_times["time/logprob"], times["bare no-grad forward"], strict=True)
        logprob = median([t / b for t, b in per_repeat])
        print(
            f"  TrainActor time/logprob (old log-probs, advantages, metrics) / bare no-grad forward: median of "
            f"per-repeat ratios {logprob:.3f} (the figure; goal <= 1.10); engine.forward_logprobs alone "
            f"{med['engine.forward_logprobs'] / bare_fwd:.3f}"
        )
        self.attribute(engine, tokens, data)
        return {"train": ratio, "logprob": logprob}

    def attribute(self, engine: Any, tokens: list[list[int]], data: Any) -> None:
        """Time pieces of the engine's overhead on their own (medians of 5)."""
        import torch

        from slime_like.trainer.megatron.packing import pack, split_micro_batches
        from slime_like.trainer.megatron.parallel import share_from_last_stage

        lengths = [len(t) for t in tokens]

        def packing() -> None:
            for ids in split_micro_batches(range(len(tokens)), lengths, self.args.max_tokens_per_gpu):
                pack(tokens, ids)

        outputs = {i: (torch.randn(n - 1), None) for i, n in enumerate(lengths)}

        def share() -> None:
            share_from_last_stage(outputs, lambda parts: {i: v for part in parts for i, v in part.items()})

        actor = self.actor
        rank_share = actor._own_share(data)
        forwards, _ = actor._forwards(rank_share)

        def rl_batch() -> None:
            actor.step.rl_batch(rank_share, forwards)

        pieces = {
            "packing the batch (pack, all micro-batches)": packing,
            f"share_from_last_stage of {len(tokens)} log-prob tensors": share,
            "the RL step's batch (rl_batch: advantages, metrics)": rl_batch,
        }
        print("  pieces of the overhead, timed alone:")
        for name, fn in pieces.items():
            samples = []
            for _ in range(5):
                start = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - start)
            print(f"    {name:<52}{median(samples) * 1e3:7.1f} ms")
