"""Annotation: automatic metrics, LLM-as-judge and reward combination (see runner.annotate)."""
