"""Training on stored experience: the bridge (store -> TRL datasets and masks), SFT, GRPO, RFT and iterate.

Modules import torch/transformers/trl only inside the functions that train, so importing omrl stays fast.
"""
