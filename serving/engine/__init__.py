"""The embedded policy engine: an OpenAI-compatible server over transformers + PEFT (CPU)."""
