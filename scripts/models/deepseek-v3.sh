# DeepSeek-V3 (MLA attention, 256 routed + 1 shared expert, first 3 layers dense), checked against config.json.
MODEL_ARGS=(
   --num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128
   --swiglu --disable-bias-linear --normalization RMSNorm --norm-epsilon 1e-6
   --use-rotary-position-embeddings --rotary-base 10000 --vocab-size 129280
   --untie-embeddings-and-output-weights
   # multi-latent attention
   --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512
   --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128 --qk-layernorm
   # MoE
   --num-experts 256 --moe-router-topk 8 --moe-ffn-hidden-size 2048 --moe-shared-expert-intermediate-size 2048
   --moe-layer-freq "[0]*3+[1]*58" --moe-router-score-function sigmoid --moe-router-enable-expert-bias
   --moe-router-num-groups 8 --moe-router-group-topk 4 --moe-router-topk-scaling-factor 2.5
   --moe-token-dispatcher-type alltoall --moe-grouped-gemm --moe-router-dtype fp32 --moe-aux-loss-coeff 0
)
