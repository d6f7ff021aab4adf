"""stackgate: provision a pinned GPU LLM-serving stack, prove it is sound, gate a deployment."""

__version__ = "0.1.0"
