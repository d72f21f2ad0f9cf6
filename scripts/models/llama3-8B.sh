# Llama 3 8B: Megatron architecture flags; they must match the HF config.json (checked at start).
MODEL_ARGS=(
   --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336
   --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128
   --swiglu --disable-bias-linear --normalization RMSNorm --norm-epsilon 1e-5
   --use-rotary-position-embeddings --rotary-base 500000 --vocab-size 128256
   --untie-embeddings-and-output-weights
)
