# The CPU demo's tiny Qwen3 (tools/make_tiny_model.py --hidden-size 128 --ffn-hidden-size 256 --num-layers 4).
MODEL_ARGS=(
   --num-layers 4 --hidden-size 128 --ffn-hidden-size 256
   --num-attention-heads 4 --group-query-attention --num-query-groups 2 --kv-channels 32
   --swiglu --disable-bias-linear --qk-layernorm --normalization RMSNorm --norm-epsilon 1e-6
   --use-rotary-position-embeddings --rotary-base 10000 --vocab-size 512
)
