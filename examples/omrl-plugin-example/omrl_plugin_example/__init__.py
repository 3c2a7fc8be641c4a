"""An example omrl plugin: one environment, one import format, one metric and one policy."""
