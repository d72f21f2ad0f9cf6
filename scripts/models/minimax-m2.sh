# MiniMax-M2 / M2.5 229B-A10B (minimax_m2: 256 experts top-8 in all 62 layers, no shared expert, sigmoid routing
# with expert bias; GQA 48/8 heads with a QK norm over all heads; RoPE on half of each head): Megatron
# architecture flags, checked against config.json. The flags and values of slime's scripts/models/minimax-m2.sh;
# its --spec is accepted, and the family registry builds the all-heads QK norm (slime_like/trainer/megatron/all_heads_qk_norm.py).
MODEL_ARGS=(
   --spec "slime_plugins.models.minimax_m2" "get_minimax_m2_layer_spec"
   --num-layers 62 --hidden-size 3072 --ffn-hidden-size 1536
   --num-attention-heads 48 --group-query-attention --num-query-groups 8 --kv-channels 128
   --swiglu --disable-bias-linear --normalization RMSNorm --norm-epsilon 1e-6
   --position-embedding-type rope --rotary-percent 0.5 --rotary-base 5000000 --no-rope-fusion
   --qk-layernorm --attention-softmax-in-fp32
   --vocab-size 200064 --untie-embeddings-and-output-weights
   # MoE
   --moe-layer-freq "[1]*62" --num-experts 256 --moe-router-topk 8 --moe-ffn-hidden-size 1536
   --moe-router-score-function sigmoid --moe-router-pre-softmax --moe-router-enable-expert-bias
   --moe-router-load-balancing-type none --moe-token-dispatcher-type alltoall --moe-router-dtype fp32
   --moe-aux-loss-coeff 0 --moe-grouped-gemm --moe-permute-fusion
)
