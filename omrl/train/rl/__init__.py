"""RL internals: group and step advantages, GAE, GRPO's step-credit trainer and PPO's update."""
