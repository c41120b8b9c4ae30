"""Automatic prompt optimisation: `tracetrain optimize-prompt`, an algorithm beside the learner
that changes the agent's system prompt instead of its weights."""
