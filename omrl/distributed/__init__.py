"""Playing episodes past one machine: omrl.distributed.ray_collect runs collection shards on a Ray cluster."""
