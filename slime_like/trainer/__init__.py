"""The trainer layer: Megatron ranks, the RL algorithms, weight updates to the engines, their flags."""
