"""Iterate: the multi-stage orchestrator (run), its held-out evaluation, its resumable state and the demo."""
