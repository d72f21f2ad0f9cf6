# Qwen3-4B: Megatron architecture flags; they must match the HF config.json (checked at start).
MODEL_ARGS=(
   --num-layers 36 --hidden-size 2560 --ffn-hidden-size 9728
   --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128
   --swiglu --disable-bias-linear --qk-layernorm --normalization RMSNorm --norm-epsilon 1e-6
   --use-rotary-position-embeddings --rotary-base 1000000 --vocab-size 151936
)
