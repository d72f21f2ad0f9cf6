"""Launch one SGLang server (CPU or GPU) and wait until it is healthy; its HTTP calls are in sglang_client."""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from rollout.sglang_client import freeze_gc
from slime_like.core.process import ManagedProcess, PortInUseError, check_port_free, free_port
from slime_like.core.secret import API_KEY_ENV, LAUNCH_WITH_KEY, run_secret

logger = logging.getLogger(__name__)

# CPU-only settings (each measured on our 2-core machines; the reasons are beside them); none apply on GPU.
CPU_FLAGS = (
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--disable-cuda-graph",
    "--skip-server-warmup",
    "--sleep-on-idle",  # else an idle scheduler busy-polls most of a core
    # xgrammar's vocab-mask kernel is CUDA-only: a constrained request (regex, json_schema) kills the
    # scheduler on CPU ("Unsupported device: cpu"); llguidance masks on CPU.
    "--grammar-backend", "llguidance",
)  # fmt: skip
CPU_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",  # without it SGLang takes the GPU path and fails importing vllm
    "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0",  # else every /health runs a generation
}
# Without a cap SGLang reserves a ~15 GB KV cache on CPU and takes ~55 s to start.
CPU_MAX_TOTAL_TOKENS = 65536
# SGLang's HTTP server closes a connection idle for 5 s by default, while the router keeps it pooled: a rollout that
# starts ~5 s after the last one's requests ended races those closes, the router's sends fail, and after 10 failures
# its circuit breaker takes the engine out for 60 s (seen in scripts/bench/bench_fully_async.py's sync loop, whose
# log-prob + train + update took ~4-5 s). The server keeps idle connections longer than the router pools them.
KEEP_ALIVE_ENV = {"SGLANG_TIMEOUT_KEEP_ALIVE": "3600"}
# SGLang caches each image's vision-tower embedding by the image's hash, across weight updates: after an update that
# trains the tower, an image seen again (every eval, every later epoch, the weight check's probe) would be served with
# the old tower's embedding (the demo's train/rollout log-prob mismatch jumped from 1e-7 to ~1 at its second epoch).
# No cache for vision-language servers, as slime's patched SGLang does for RL (rl_on_policy_target).
VLM_ENV = {"SGLANG_VLM_CACHE_SIZE_MB": "0"}
# On CPU, SGLang's routed-experts capture (R3) and its LoRA manager need their host tensors unpinned, and on every
# device a LoRA server gets the one-request adapter swap: rollout/sglang_launch.py says why.
ROUTED_EXPERTS_FLAG = "--enable-return-routed-experts"
LORA_FLAGS = ("--enable-lora", "--lora-paths")
# SGLang's default LoRA backend (csgmv) and triton run Triton kernels; its torch_native backend runs on CPU.
CPU_LORA_BACKEND = "torch_native"
# SGLang's torch.distributed rendezvous (a TCPStore on host:--nccl-port, also with one rank) binds a port that SGLang
# otherwise asks the OS for (get_free_port) when it starts and binds seconds later in its scheduler: a port from the
# ephemeral range, where any outgoing connection on the machine can take it as its source port meanwhile, and the
# server dies at start ("EADDRINUSE"). The server gets one drawn below that range, as its HTTP port is
# (slime_like/core/process.py, LISTEN_PORTS).
NCCL_PORT_FLAG = "--nccl-port"
# SGLang starts its scheduler and detokenizer with multiprocessing's spawn (sglang/srt/entrypoints/engine.py), so each
# imports torch, transformers and SGLang again: two interpreters' imports, ~7 CPU-seconds each, on a machine whose
# trainer starts at the same time. Without CUDA nothing forbids fork, and forked children start with what the
# server process has imported: measured on 2 cores, a tiny Qwen3 server ready in 14-16 s instead of 28-33 s, with the
# same log-probs. Then LAUNCH_WITH_KEY runs the module (the key, if any, from the environment).
LAUNCH_FORKED_ON_CPU = (
    """
import multiprocessing
_set_start_method = multiprocessing.set_start_method
multiprocessing.set_start_method = lambda method, force=False: _set_start_method("fork", force=True)
"""
    + LAUNCH_WITH_KEY
)


def needs_remote_code(model_path: str | Path) -> bool:
    """Whether the checkpoint's config.json names its own code (auto_map: Kimi-K2, MiMo), which SGLang loads only
    with --trust-remote-code (else it stops at start: "contains custom code ... trust_remote_code=True")."""
    config = Path(model_path) / "config.json"
    try:
        return "auto_map" in json.loads(config.read_text())
    except (OSError, ValueError):
        return False  # not a local checkpoint, or no readable config: SGLang's own checks say what is wrong


def is_vision_language(model_path: str | Path) -> bool:
    """Whether the checkpoint's config.json has a vision tower (`vision_config`: Qwen2.5-VL, Qwen3-VL, Qwen3.5)."""
    try:
        return "vision_config" in json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return False


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (imported lazily: torch is slow to import)."""
    import torch

    return torch.cuda.is_available()


def validate_model_path(model_path: str | Path) -> Path:
    """Return the checkpoint directory, or raise FileNotFoundError naming what is missing."""
    path = Path(model_path)
    if not path.is_dir():
        raise FileNotFoundError(
            f"SGLang model path {str(path)!r} does not exist or is not a directory; "
            "pass a Hugging Face checkpoint directory (config.json, tokenizer and weights)"
        )
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"SGLang model path {str(path)!r} has no config.json; it must be a Hugging Face checkpoint directory "
            "(convert a Megatron checkpoint to HF first)"
        )
    return path


class SGLangServer:
    """One `python -m sglang.launch_server` process, its URL and its log."""

    def __init__(
        self,
        model_path: str | Path,
        host: str = "127.0.0.1",
        port: int | None = None,
        extra_args: Sequence[str] = (),
        log_dir: str | Path | None = None,
        startup_timeout: float = 180.0,
        device: str | None = None,
        dtype: str | None = None,
        max_total_tokens: int | None = None,
        mem_fraction_static: float | None = None,
        omp_num_threads: int | None = None,
        stop_timeout: float = 15.0,
        node_rank: int = 0,
        api_key: str | None = None,
    ) -> None:
        self.model_path = Path(model_path)
        self.host = host
        self.port = port
        self.extra_args = list(extra_args)
        self.log_dir = Path(log_dir) if log_dir else None
        self.startup_timeout = startup_timeout
        self.device = device
        self.dtype = dtype
        self.max_total_tokens = max_total_tokens
        self.mem_fraction_static = mem_fraction_static
        self.omp_num_threads = omp_num_threads
        self.stop_timeout = stop_timeout
        self.node_rank = node_rank  # > 0: one node's share of a multi-node engine, with only a /health endpoint
        # Every request but /health must carry it (SGLang's --api-key); None: this process's run secret, if any.
        self.api_key = api_key if api_key is not None else run_secret()
        self.nccl_port: int | None = None  # its torch.distributed rendezvous port (NCCL_PORT_FLAG), once drawn
        self.process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        """The base URL, e.g. http://127.0.0.1:30000 (known once start() has chosen the port)."""
        if self.port is None:
            raise RuntimeError("SGLangServer has no port yet: call start() first")
        return f"http://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        """The server's combined stdout/stderr log."""
        if self.process is None:
            raise RuntimeError("SGLangServer has no log yet: call start() first")
        return self.process.log_path

    def command(self) -> tuple[list[str], dict[str, str]]:
        """The launch command and the extra environment for this server."""
        on_cpu = (self.device or ("cuda" if cuda_available() else "cpu")) == "cpu"
        env = {k: v for k, v in KEEP_ALIVE_ENV.items() if k not in os.environ}
        lora = any(flag in self.extra_args for flag in LORA_FLAGS)
        # LoRA servers (any device) for the one-request adapter swap; on CPU R3 too, for the unpinning hooks;
        # vision-language checkpoints for token-in with images (rollout/sglang_vlm.py).
        vision = is_vision_language(self.model_path)
        env |= {k: v for k, v in VLM_ENV.items() if vision and k not in os.environ}
        hooked = lora or (on_cpu and ROUTED_EXPERTS_FLAG in self.extra_args) or vision
        module = "rollout.sglang_launch" if hooked else "sglang.launch_server"
        if on_cpu:  # the key (if any) in the environment: a command line is world-readable on the node
            cmd = [sys.executable, "-c", LAUNCH_FORKED_ON_CPU, module]
            env[API_KEY_ENV] = self.api_key or ""  # empty: no key, whatever this process's environment holds
        elif self.api_key:
            cmd = [sys.executable, "-c", LAUNCH_WITH_KEY, module]
            env[API_KEY_ENV] = self.api_key
        else:
            cmd = [sys.executable, "-m", module]
        cmd += ["--model-path", str(self.model_path), "--host", self.host, "--port", str(self.port)]
        if NCCL_PORT_FLAG not in self.extra_args:
            cmd += [NCCL_PORT_FLAG, str(self._nccl_port())]
        if on_cpu:
            cmd += CPU_FLAGS
            env.update(CPU_ENV)
            # One thread per process: two threads were 3-5x slower when several processes share 2 cores.
            env["OMP_NUM_THREADS"] = str(self.omp_num_threads or 1)
            tp = self._tp_size()
            if tp > 1 and "SGLANG_CPU_OMP_THREADS_BIND" not in os.environ:
                # SGLang's CPU engine binds each TP rank to a NUMA node unless told which cores: one core per rank.
                cores = os.cpu_count() or 1
                env["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(str(rank % cores) for rank in range(tp))
        elif self.omp_num_threads:
            env["OMP_NUM_THREADS"] = str(self.omp_num_threads)
        max_tokens = self.max_total_tokens or (CPU_MAX_TOTAL_TOKENS if on_cpu else None)
        if max_tokens:
            cmd += ["--max-total-tokens", str(max_tokens)]
        if self.mem_fraction_static is not None:
            cmd += ["--mem-fraction-static", str(self.mem_fraction_static)]
        if self.dtype:
            cmd += ["--dtype", self.dtype]
        if needs_remote_code(self.model_path) and "--trust-remote-code" not in self.extra_args:
            cmd.append("--trust-remote-code")  # as the trainer reads the config (slime_like/core/hf_config.py)
        if on_cpu and lora and "--lora-backend" not in self.extra_args:
            cmd += ["--lora-backend", CPU_LORA_BACKEND]
        return cmd + self.extra_args, env

    def _nccl_port(self) -> int:
        """The rendezvous port, drawn once from LISTEN_PORTS (never the HTTP port)."""
        while self.nccl_port is None or self.nccl_port == self.port:
            self.nccl_port = free_port(self.host)
        return self.nccl_port

    def _drawn_port(self) -> int:
        """A free port for the server (LISTEN_PORTS: port + 10000, SGLang's gRPC port, stays valid), drawn again
        when another process binds it between the draw and the check (free_port serialises this process's draws)."""
        for _ in range(5):
            port = free_port(self.host)
            try:
                check_port_free(self.host, port)
                return port
            except PortInUseError as exc:  # the message names what holds it
                logger.warning("a port drawn for the server was taken at once (%s); drawing another", exc)
        return free_port(self.host)  # a fifth race in a row: start() names the port when it fails

    def _tp_size(self) -> int:
        """The --tp-size among the extra arguments (1 when absent)."""
        for flag in ("--tp-size", "--tp", "--tensor-parallel-size"):
            if flag in self.extra_args:
                return int(self.extra_args[self.extra_args.index(flag) + 1])
        return 1

    def start(self, wait: bool = True) -> SGLangServer:
        """Validate the inputs, launch the server and (by default) wait until /health answers 200."""
        if self.process is not None:
            raise RuntimeError(f"SGLang server at {self.url} was already started")
        validate_model_path(self.model_path)
        if self.port is None:
            self.port = self._drawn_port()
        if self.port + 10000 > 65535 and "SGLANG_GRPC_PORT" not in os.environ:
            raise ValueError(
                f"SGLang port {self.port} is too high: SGLang derives a gRPC port as port + 10000 and refuses one "
                "above 65535; use a port below 55536 (or leave it unset), or set SGLANG_GRPC_PORT"
            )
        check_port_free(self.host, self.port)
        cmd, env = self.command()
        log_dir = self.log_dir or Path(tempfile.mkdtemp(prefix="slime_like_sglang_"))
        log_path = log_dir / f"sglang_{self.port}.log"
        if self.api_key:  # SGLang logs its arguments, the secret among them: owner-only from the first byte
            log_dir.mkdir(parents=True, exist_ok=True)
            log_path.touch(mode=0o600)
        self.process = ManagedProcess(cmd, log_path, env=env, name=f"SGLang server (port {self.port})").start()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> None:
        """Block until /health answers 200; on failure stop the server and raise ProcessStartError."""
        if self.process is None:
            raise RuntimeError("SGLangServer.wait_ready() before start()")
        try:
            self.process.wait_http_ok(f"{self.url}/health", timeout=self.startup_timeout, what="healthy")
        except BaseException:
            self.stop()  # a half-started server must not linger
            raise
        if self.node_rank == 0:  # later node ranks serve /health only
            freeze_gc(self.url, api_key=self.api_key)  # its own key, which may not be this process's

    def stop(self, grace: float | None = None) -> int | None:
        """Stop the server (SIGTERM, SIGKILL after `grace`, default `stop_timeout`, seconds); its exit status."""
        return self.process.stop(self.stop_timeout if grace is None else grace) if self.process else None

    def __enter__(self) -> SGLangServer:
        return self if self.process else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
