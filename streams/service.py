"""The streams stage's process, declared once: a Faust worker of the rollout join.

    tracetrain up --services kafka,streams

Several workers with the same settings share the partitions: start each with its own
`instance` name and `streams.web_port`. Supervised: a worker that exits (it does, with status
70, when Kafka failed a record it wrote) is started again (infra/supervise.py).
"""

from __future__ import annotations

from infra.services import Service, cli

STREAMS = Service(
    name="streams",
    summary="Faust worker: AIR deriver and rollout join into credit-assigned transitions",
    reads=("spans", "rewards", "air"),
    writes=("transitions", "air", "dlq", "the rollouts table's changelog"),
    argv=lambda s: cli("streams"),
    listen=lambda s: (s.streams.web_host, s.streams.web_port),
    health_path="/healthz",
    start_timeout_s=lambda s: s.streams.start_timeout_s,
    restart=True,
    port_setting="streams.web_port",
)
