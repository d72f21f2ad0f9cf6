#!/usr/bin/env bash
# The GPU proof run on a lent GPU machine (CUDA torch, no SGLang, no Transformer Engine): install the carried
# megatron-core / mbridge / torch_memory_saver / flash-linear-attention wheels, then the chosen steps, each under its
# own time limit. Logs and the benchmark's JSON go to $OUT.
#   pip download ... -d .whl megatron-core==0.16.1 mbridge==0.15.1 torch_memory_saver flash-linear-attention==0.4.0
#   STEPS="bench gpu engine families" (the default; any subset, in that order)
set -u
OUT=${OUT:-/tmp/gpu-check}
STEPS=" ${STEPS:-bench gpu engine families} "
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers, triton, megatron.core as m; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__, 'megatron-core', m.__version__)"
} 2>&1 | tee "$OUT/env.txt"
# A test that hangs (a Triton autotune, a collective) prints every thread's stack after this many seconds.
PYTEST="python3 -m pytest -p no:cacheprovider -o faulthandler_timeout=${STALL_S:-90} -ra -q"
if [[ $STEPS == *" bench "* ]]; then
  mkdir -p /tmp/bench
  timeout "${BENCH_S:-270}" python3 scripts/bench/bench_train_gpu.py --json "$OUT/bench.json" --workdir /tmp/bench \
    ${BENCH_ARGS:-} 2>&1 | grep -v -i warn | tee "$OUT/bench.log"
fi
if [[ $STEPS == *" gpu "* ]]; then
  timeout "${TESTS_S:-100}" $PYTEST -m gpu tests/gpu -x 2>&1 | tee "$OUT/gpu_tests.log"
fi
if [[ $STEPS == *" engine "* ]]; then
  timeout "${ENGINE_S:-60}" $PYTEST -m megatron tests/megatron/test_packing.py tests/megatron/test_bench_train_gpu.py \
    2>&1 | tee "$OUT/engine_tests.log"
fi
if [[ $STEPS == *" families "* ]]; then
  # Every family's logits against transformers' on the same device and its export from the model on the GPU; then
  # Qwen3-Next / Qwen3.5, whose gated delta net runs fla's Triton kernels there (the first forward autotunes them for
  # a minute or two).
  timeout "${FAMILIES_S:-150}" $PYTEST -m megatron tests/megatron/test_families.py -k "not qwen3_next and not qwen3_5" \
    2>&1 | tee "$OUT/families.log"
  timeout "${GDN_S:-200}" $PYTEST -v -m megatron tests/megatron/test_families.py -k "qwen3_next or qwen3_5" \
    2>&1 | tee "$OUT/gdn.log"
fi
