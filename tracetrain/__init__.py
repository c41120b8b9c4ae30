"""tracetrain: agents that learn from their own traffic.

This package is the core every stage stands on and that imports no stage: the one settings
object and its sections (`tracetrain.settings`), the error hierarchy (`tracetrain.errors`), the
dead-letter contract (`tracetrain.deadletter`), the typed records of the Avro schemas
(`tracetrain.records`), the allowed values of each mode (`tracetrain.modes`) and the default
base model (`tracetrain.base_model`). The one exception is `tracetrain.cli` (and
`python -m tracetrain`), the process entry point above every stage. The pipeline's stages are
top-level packages: schemas, producers, streams, learner, serving, infra; examples and demo
sit above them. See docs/architecture.md.
"""

__version__ = "0.1.0"
