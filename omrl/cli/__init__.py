"""The `omrl` command line: one click group, one small module per verb."""
