"""Fixtures of the streams tests: settings for a worker on this test's topics, a factory that
starts real worker processes (`tracetrain streams`) and kills them afterwards (producing and
reading topics: testkit.streams)."""

from __future__ import annotations

import pytest

from infra import processes, services
from streams.service import STREAMS

STREAMS_DEFAULTS = {"idle_timeout_s": 6.0, "close_grace_s": 1.0, "timer_interval_s": 0.1,
                    "credit": "air"}


@pytest.fixture
def streams_settings(kafka_settings):
    """Full settings on this test's topics with a short idle timeout; web port chosen per worker."""
    streams = kafka_settings.streams.model_copy(update=STREAMS_DEFAULTS)
    return kafka_settings.model_copy(update={"streams": streams})


@pytest.fixture
def workers(request):
    """start(settings, name) -> ProcessRecord; every worker started is killed at the end."""
    started = []

    def start(settings, name="streams", **streams_overrides):
        streams = settings.streams.model_copy(update={"web_port": processes.free_port(), **streams_overrides})
        settings = settings.model_copy(update={"streams": streams})
        # a per-test name, so workers of different tests never share a pid file
        record = services.start(settings, STREAMS,
                                instance=f"{name}-{request.node.name[:30]}-{len(started)}",
                                extra_argv=["--max-seconds", "600"])
        started.append((settings, record))
        return record

    yield start
    for settings, record in started:
        processes.stop(settings.home_dir, record.name, timeout_s=5)
