"""tracetrain: agents that learn from their own traffic.

Cross-cutting pieces live here: the one settings object (`tracetrain.settings`), the error
base classes (`tracetrain.errors`), the state folder (`tracetrain.home`), the default base
model cache (`tracetrain.base_model`) and the `tracetrain` console script (`tracetrain.cli`).
Each pipeline stage is its own top-level package: schemas, producers, streams, learner,
serving, infra, examples, bench.
"""

__version__ = "0.1.0"
