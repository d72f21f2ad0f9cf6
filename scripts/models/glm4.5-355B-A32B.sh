# GLM-4.5 / 4.6 / 4.7 355B-A32B (glm4_moe: 160 experts top-8, 3 dense layers, partial RoPE): Megatron
# architecture flags, checked against config.json. The flags and values of slime's scripts/models/glm4.5-355B-A32B.sh.
N_DENSE_LAYERS=3
N_MOE_LAYERS=89

MODEL_ARGS=(
   --num-layers $((N_DENSE_LAYERS + N_MOE_LAYERS)) --hidden-size 5120 --ffn-hidden-size 12288
   --num-attention-heads 96 --group-query-attention --num-query-groups 8 --kv-channels 128
   --swiglu --disable-bias-linear --add-qkv-bias --qk-layernorm --normalization RMSNorm
   --position-embedding-type rope --rotary-percent 0.5 --rotary-base 1000000
   --vocab-size 151552 --untie-embeddings-and-output-weights
   # MoE
   --moe-layer-freq "[0]*$N_DENSE_LAYERS+[1]*$N_MOE_LAYERS" --num-experts 160 --moe-router-topk 8
   --moe-ffn-hidden-size 1536 --moe-shared-expert-intermediate-size 1536
   --moe-router-score-function sigmoid --moe-router-pre-softmax --moe-router-enable-expert-bias
   --moe-router-bias-update-rate 0 --moe-router-load-balancing-type seq_aux_loss --moe-router-topk-scaling-factor 2.5
   --moe-token-dispatcher-type alltoall --moe-router-dtype fp32 --moe-aux-loss-coeff 0
   --moe-grouped-gemm --moe-permute-fusion
)
