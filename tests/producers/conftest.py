"""Fixtures of the producers tests: settings on a broker of our own (testkit's `own_broker`,
which a test can stop and restart without disturbing the session broker), the fixed upstream
and a gateway in front of it. Reading back what arrived: testkit.producers.consume."""

from __future__ import annotations

import contextlib
import itertools
import uuid

import pytest
from pydantic import SecretStr

from infra import processes, topics
from testkit.producers import running_gateway
from tracetrain.settings import load_settings
from tracetrain.settings.infra import TopicSettings


@pytest.fixture
def own_settings(own_broker, tmp_path):
    """Settings on our own broker with fresh topics and a per-test home (spools live there)."""
    t = TopicSettings(prefix=f"p-{uuid.uuid4().hex[:8]}", partitions=4)
    topics.create_topics(own_broker.kafka.bootstrap_servers, t)
    return load_settings().model_copy(update={"kafka": own_broker.kafka, "topics": t,
                                              "home": tmp_path})


@pytest.fixture(scope="module")
def upstream():
    """The fixed-response OpenAI-compatible server (the one allowed double: an engine)."""
    from testkit.fixed_upstream import ServerThread, app

    server = ServerThread(app(), processes.free_port()).start()
    yield server
    server.stop()


@pytest.fixture
def make_gateway(kafka_settings, upstream, tmp_path):
    """make_gateway(**gateway settings) -> (base url, settings, publisher): a real gateway
    (uvicorn, own port) in front of `upstream` (or the `upstream_url` given), keys key-1 and
    key-2, a 64 KiB body limit unless told otherwise, publishing to this test's topics on the
    session broker. Each is stopped at the end."""
    made = itertools.count()
    with contextlib.ExitStack() as running:
        def make(**changes):
            n = next(made)
            target = changes.pop("upstream_url", upstream.url + "/v1")
            return running.enter_context(running_gateway(
                kafka_settings, target, tmp_path / f"spool-{n}", f"gw-test-{n}",
                **{"max_body_bytes": 64 * 1024,
                   "api_keys": [SecretStr("key-1"), SecretStr("key-2")], **changes}))

        yield make


@pytest.fixture
def gateway(make_gateway):
    """The gateway of `make_gateway` with its defaults: (base url, settings, publisher)."""
    return make_gateway()
