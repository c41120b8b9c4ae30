"""The broker's view of the join's input partitions: end offsets and the group's committed
offsets, asked on Kafka clients of the worker's own (see `Offsets`)."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition
from faust.types import TP


class Offsets:
    """End offsets of input partitions and the group's committed offsets, asked on clients
    of our own. Asked through Faust's consumer, the ListOffsets request queued behind that
    connection's fetch long-poll (Faust's 1.5 s then; streams/transport.py now shortens it): a
    timer tick took ~1.4 s for it alone. Committed offsets come from the broker too, not from
    Faust consumer's private `_committed_offset`, which it fills only at its own seek after
    recovery and maps offset 0 to None: a partition missing there looked unread forever, and
    its rollouts never closed."""

    def __init__(self, bootstrap_servers: str, group_id: str, timeout_s: float = 5.0):
        self.bootstrap_servers, self.group_id, self.timeout_s = bootstrap_servers, group_id, timeout_s
        self.consumer: AIOKafkaConsumer | None = None
        self.admin: AIOKafkaAdminClient | None = None

    async def ends(self, tps: list[TP]) -> dict[TP, int]:
        if self.consumer is None:
            client = AIOKafkaConsumer(bootstrap_servers=self.bootstrap_servers, group_id=None,
                                      enable_auto_commit=False,
                                      request_timeout_ms=int(self.timeout_s * 1000))
            await client.start()
            self.consumer = client
        ends = await asyncio.wait_for(
            self.consumer.end_offsets([TopicPartition(tp.topic, tp.partition) for tp in tps]),
            self.timeout_s)
        return {TP(tp.topic, tp.partition): end for tp, end in ends.items()}

    async def committed(self, tps: list[TP]) -> dict[TP, int]:
        """The group's next offset to read per partition; -1 where it committed none."""
        if self.admin is None:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap_servers,
                                        request_timeout_ms=int(self.timeout_s * 1000))
            await admin.start()
            self.admin = admin
        offsets = await asyncio.wait_for(self.admin.list_consumer_group_offsets(
            self.group_id, partitions=[TopicPartition(tp.topic, tp.partition) for tp in tps]),
            self.timeout_s)
        found = {TP(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items()}
        return {tp: found.get(tp, -1) for tp in tps}

    async def close(self) -> None:
        consumer, admin, self.consumer, self.admin = self.consumer, self.admin, None, None
        if consumer is not None:
            await consumer.stop()
        if admin is not None:
            await admin.close()
