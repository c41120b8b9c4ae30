"""How large a record Kafka takes: the producer's and the topics' real maxima.

    limits = RecordLimits(admin_config, producer_max=1_000_000, topics=[spans, rewards])
    limits.refresh(timeout_s=5)            # reads each topic's max.message.bytes from the broker
    limits.message_max()                   # message.max.bytes for the next producer
    limits.record_limit                    # largest key + value that producer hands to Kafka

librdkafka refuses at `produce()` a record whose key + value + 36 bytes exceed its
`message.max.bytes`; the broker refuses a whole batch (innocent records included) larger than
the topic's `max.message.bytes` after compression. So the producer is made with a
`message.max.bytes` no larger than the smallest topic maximum less a batch header: then every
record that passes librdkafka's check fits its topic, and no batch is refused. Sizes compare
the uncompressed record: a record that would only fit once compressed is refused too.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import wait

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource

log = logging.getLogger(__name__)

# librdkafka's per-record allowance in its own check (RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD):
# measured with confluent-kafka 2.16, the largest value produce() takes with an 8-byte key
# and message.max.bytes 1,000,000 is 999,956.
RECORD_OVERHEAD = 36
# The v2 record-batch header the broker counts against the topic's max.message.bytes: a record
# of key + value + 36 == max.message.bytes was refused by a Kafka 4.1 broker.
BATCH_OVERHEAD = 61
LIBRDKAFKA_MIN = 1000  # librdkafka's smallest allowed message.max.bytes


class RecordLimits:
    """The topics' maxima as last read from the broker, and what the producer was made with."""

    def __init__(self, admin_config: dict, producer_max: int, topics: list[str]):
        self.admin_config = admin_config
        self.producer_max = producer_max
        self.topics = set(topics)
        self.topic_max: dict[str, int] = {}
        self.in_use = producer_max  # message.max.bytes of the producer that sends now
        self.record_limit = producer_max - RECORD_OVERHEAD

    def message_max(self) -> int:
        """message.max.bytes for a producer: the setting, lowered to fit every known topic."""
        fits = [m - BATCH_OVERHEAD for m in self.topic_max.values()]
        return max(LIBRDKAFKA_MIN, min([self.producer_max, *fits]))

    def use(self, message_max: int) -> None:
        """A producer with this message.max.bytes is now the one that sends."""
        self.in_use, self.record_limit = message_max, message_max - RECORD_OVERHEAD

    def outdated(self) -> bool:
        """Whether the producer that sends now would hand a topic records it refuses."""
        return self.message_max() < self.in_use

    def known(self) -> bool:
        return self.topics <= set(self.topic_max)

    def refresh(self, timeout_s: float = 5.0, stop: threading.Event | None = None) -> bool:
        """Read max.message.bytes of every topic from the broker; True when all were read.
        A topic that does not exist yet, or a broker that does not answer, keeps its last
        figure (or none) and is asked again at the next refresh. Returns early on `stop`."""
        resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in sorted(self.topics)]
        try:
            client = AdminClient({**self.admin_config, "log_level": 0})
            futures = client.describe_configs(resources, request_timeout=timeout_s)
        except KafkaException as exc:  # a bad property: the producer's limit goes on applying
            log.warning("topic limits cannot be read: %s", exc.args[0].str())
            return False
        deadline = time.monotonic() + timeout_s
        pending = set(futures.values())
        while pending and time.monotonic() < deadline and not (stop and stop.is_set()):
            _done, pending = wait(pending, timeout=0.1)
        for resource, future in futures.items():
            if not future.done():
                continue
            try:
                self.topic_max[resource.name] = int(future.result()["max.message.bytes"].value)
            except Exception as exc:  # noqa: BLE001 (KafkaException: asked again later)
                log.debug("topic limits: %s: %r", resource.name, exc)
        return self.known()
