# Qwen3-30B-A3B (MoE, 128 experts, top-8): Megatron architecture flags, checked against config.json.
MODEL_ARGS=(
   --num-layers 48 --hidden-size 2048 --ffn-hidden-size 6144
   --num-attention-heads 32 --group-query-attention --num-query-groups 4 --kv-channels 128
   --swiglu --disable-bias-linear --qk-layernorm --normalization RMSNorm --norm-epsilon 1e-6
   --use-rotary-position-embeddings --rotary-base 1000000 --vocab-size 151936
   --untie-embeddings-and-output-weights
   # MoE
   --num-experts 128 --moe-router-topk 8 --moe-ffn-hidden-size 768 --moe-layer-freq "[1]*48"
   --moe-router-score-function softmax --moe-token-dispatcher-type alltoall --moe-grouped-gemm
   --moe-router-dtype fp32 --moe-aux-loss-coeff 0
)
