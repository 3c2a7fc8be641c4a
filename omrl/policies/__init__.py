"""Policies: what chooses the agent's next message (LLM endpoints, in-process models, scripted experts)."""
