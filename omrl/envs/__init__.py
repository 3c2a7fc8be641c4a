"""Environments: the protocol (base.py) and the built-in environments, one module each."""
