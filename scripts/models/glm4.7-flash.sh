# GLM-4.7-Flash (glm4_moe_lite: 30B-A3B, multi-latent attention, 64 experts top-4, 1 dense layer): Megatron
# architecture flags, checked against config.json. The flags and values of slime's scripts/models/glm4.7-30B-A3B.sh.
MOE_ROUTED_EXPERTS=64
MOE_ACTIVE_ROUTED_EXPERTS=4
MOE_SHARED_EXPERTS=1
NHIDDEN=2048
MOE_FFN_HIDDEN=1536
MOE_SHARED_EXPERT_INTERMEDIATE_SIZE=$((MOE_FFN_HIDDEN * MOE_SHARED_EXPERTS))
FFN_HIDDEN=10240
N_DENSE_LAYERS=1
N_MOE_LAYERS=46
NHEADS=20

MODEL_ARGS=(
   --num-layers $((N_DENSE_LAYERS + N_MOE_LAYERS)) --hidden-size $NHIDDEN --ffn-hidden-size $FFN_HIDDEN
   --num-attention-heads $NHEADS --swiglu --disable-bias-linear --add-qkv-bias --normalization RMSNorm
   --position-embedding-type rope --no-position-embedding --rotary-base 1000000 --no-rope-fusion
   --vocab-size 154880 --make-vocab-size-divisible-by 64 --untie-embeddings-and-output-weights
   # multi-latent attention
   --multi-latent-attention --q-lora-rank 768 --kv-lora-rank 512 --qk-head-dim 192 --v-head-dim 256
   --kv-channels 192 --qk-pos-emb-head-dim 64 --qk-layernorm
   # MoE
   --moe-layer-freq "[0]*$N_DENSE_LAYERS+[1]*$N_MOE_LAYERS" --num-experts $MOE_ROUTED_EXPERTS
   --moe-router-topk $MOE_ACTIVE_ROUTED_EXPERTS --moe-ffn-hidden-size $MOE_FFN_HIDDEN
   --moe-shared-expert-intermediate-size $MOE_SHARED_EXPERT_INTERMEDIATE_SIZE
   --moe-router-score-function sigmoid --moe-router-pre-softmax --moe-router-enable-expert-bias
   --moe-router-bias-update-rate 0 --moe-router-load-balancing-type seq_aux_loss --moe-router-topk-scaling-factor 1.8
   --moe-aux-loss-coeff 0 --moe-router-dtype fp32 --moe-grouped-gemm --moe-permute-fusion
)
