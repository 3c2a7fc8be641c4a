"""Data into the trainers: the store -> TRL bridge with its loss masks, and the RL trainers' rollouts."""
