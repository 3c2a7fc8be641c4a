"""Models by name: tiny offline ones built from a config, and real pretrained ones built into the cache."""
