"""Fakes for the edges this machine cannot have (NVML, the SGLang server)."""
