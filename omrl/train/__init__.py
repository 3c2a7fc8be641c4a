"""Training on stored experience: the bridge (store -> TRL datasets and masks), the trainers (SFT, GRPO, PPO,
RFT: one contract and registry, omrl/train/trainer.py) and iterate.

Modules import torch/transformers/trl only inside the functions that train, so importing omrl stays fast.
"""
