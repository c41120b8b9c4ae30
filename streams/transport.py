"""Faust's aiokafka transport with the fetch long-poll taken from settings.

Faust 0.15 builds its worker consumer with `fetch_max_wait_ms=1500` written into the call and
no setting for it. aiokafka's fetcher leaves a partition whose records are still buffered out
of the fetch it sends next, and sends the following one only when that fetch returns; when the
fetch covers only partitions with nothing new, the broker holds it for the whole wait. So a
final reward on a partition just read can sit behind a 1.5 s poll before its worker sees it
(bench.streams: one run in three had p50 1.5 s, p99 2.7 s). A shorter wait bounds that delay;
its cost is one empty fetch per wait per broker on an idle worker.
"""

from __future__ import annotations

from typing import Any

import faust
from faust.transport.drivers import aiokafka as driver


class ConsumerThread(driver.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: driver.Transport) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # The attribute AIOKafkaConsumer.__init__ stores the argument in; start() hands it
        # to the fetcher, and Faust starts the consumer only after this returns.
        consumer._fetch_max_wait_ms = self.app.fetch_max_wait_ms
        return consumer


class Consumer(driver.Consumer):
    def _new_consumer_thread(self) -> ConsumerThread:
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Transport(driver.Transport):
    Consumer = Consumer


class App(faust.App):
    """A faust.App whose worker consumer long-polls the broker for `fetch_max_wait_ms`."""

    def __init__(self, *args: Any, fetch_max_wait_ms: int, **kwargs: Any) -> None:
        self.fetch_max_wait_ms = fetch_max_wait_ms
        super().__init__(*args, **kwargs)

    def _new_transport(self) -> Transport:
        return Transport(self.conf.broker_consumer, self)
