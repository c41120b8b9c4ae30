"""The OpenAI-compatible gateway: `tracetrain gateway` (see producers/gateway/app.py)."""
