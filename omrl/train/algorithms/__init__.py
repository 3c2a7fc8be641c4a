"""The trainers: SFT, GRPO, PPO and RFT, each registered in omrl.train.trainer.TRAINERS."""
