"""Work past one machine: omrl.distributed.ray_executor runs an engine's shards (collect, eval, judging) on Ray."""
