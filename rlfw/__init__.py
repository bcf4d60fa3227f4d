"""rlfw: RL post-training of vision-language models on multi-turn environments."""
