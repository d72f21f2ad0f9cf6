#!/usr/bin/env bash
# The GPU proof run on a lent GPU machine (CUDA torch, no SGLang, no Transformer Engine): install the carried
# megatron-core / mbridge / torch_memory_saver wheels, then the training benchmark, the GPU tests and the
# in-process engine tests, each under its own time limit. Logs and the benchmark's JSON go to $OUT.
#   pip download ... -d .whl megatron-core==0.16.1 mbridge==0.15.1 torch_memory_saver   (see docs/performance.md)
set -u
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers, megatron.core as m; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'megatron-core', m.__version__)"
} 2>&1 | tee "$OUT/env.txt"
mkdir -p /tmp/bench
timeout "${BENCH_S:-270}" python3 scripts/bench/bench_train_gpu.py --json "$OUT/bench.json" --workdir /tmp/bench ${BENCH_ARGS:-} \
  2>&1 | grep -v -i warn | tee "$OUT/bench.log"
timeout "${TESTS_S:-100}" python3 -m pytest -p no:cacheprovider -m gpu tests/gpu -ra -x -q 2>&1 | tee "$OUT/gpu_tests.log"
timeout "${ENGINE_S:-60}" python3 -m pytest -p no:cacheprovider -m megatron tests/megatron/test_packing.py \
  tests/megatron/test_bench_train_gpu.py -ra -q 2>&1 | tee "$OUT/engine_tests.log"
