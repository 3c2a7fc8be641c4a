"""Training on stored experience, in layers, top first:

- iterate/: the orchestrator (stages expert -> base -> sft -> grpo-N), its held-out evaluation, its resumable
  state and the learning demo (`omrl train iterate`, `omrl demo`);
- algorithms/: the trainers (sft, grpo, ppo, rft), each `train(recipe, *, store, reporter)` registered in
  trainer.TRAINERS (the one contract; trainer_progress shows their steps);
- rl/: RL internals (group and step advantages, GAE, GRPO's step-credit trainer, PPO's update);
- data/: store -> TRL (the bridge, token-faithful examples, loss masks) and the RL trainers' rollouts
  (rollout_step, TRL's rollout_func, online judged rewards);
- config/: the recipes (YAML keys, overrides and help of every trainer and of iterate) and their shared bases.

Modules import torch/transformers/trl only inside the functions that train, so importing omrl stays fast.
"""
