"""The worker's consumer long-polls for the settings' fetch wait, not Faust's fixed 1500 ms."""

from __future__ import annotations

import asyncio

from streams.app import create_app


def test_worker_consumer_fetches_with_the_settings_wait(kafka_settings):
    streams = kafka_settings.streams.model_copy(update={"fetch_max_wait_ms": 123})
    app, _ = create_app(kafka_settings.model_copy(update={"streams": streams}))

    async def started_fetch_wait() -> int:
        consumer = app.consumer._thread._create_worker_consumer(app.transport)
        await consumer.start()  # the real broker: start() builds the fetcher from the setting
        try:
            return consumer._fetcher._fetch_max_wait_ms
        finally:
            await consumer.stop()

    # If aiokafka renamed the attribute the driver sets, the fetcher would keep its 1500 ms.
    assert asyncio.run(started_fetch_wait()) == 123
