"""LLM endpoints: the one OpenAI-compatible client, what an endpoint says about itself, and its in-flight limit."""
