"""The recipes of the trainers and of iterate: dataclasses loaded by omrl.config, sharing their run keys (base)."""
