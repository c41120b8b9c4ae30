"""The engine's requests to llama-server when a connection is closed without an answer: a
real llama-server behind a proxy that closes chosen connections once the request is in, as
cpp-httplib does to a keep-alive connection it finds idle for 5 s just as a request is sent on
it. Once, the request goes out again and the caller sees nothing; twice, the call fails with
an error that says why. (A streamed call failed with "mid-stream: Server disconnected" in one
full run of test_serving_pool; this is the likeliest cause found, not a reproduction of it.)"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from serving.engine.generation import GenRequest
from serving.engine.upstream import Upstream, UpstreamError, Upstreams
from serving.llamacpp import build
from serving.llamacpp.server import LlamaServer
from serving.llamacpp.weights import base_gguf
from testkit.closing_proxy import ClosingProxy

REQUEST = GenRequest(prompt_ids=[1, 4093, 346, 253, 1345, 30], max_tokens=8, temperature=0.0,
                     seed=3)


@pytest.fixture(scope="module")
def server(base_model_dir):
    with LlamaServer(build.find_server(), base_gguf(base_model_dir, "q4_1"), slots=2,
                     context=256, threads=1) as running:
        yield running


def _through(server: LlamaServer, drops: int, call):
    """call(upstreams) run against `server` behind a proxy that closes the first `drops`
    connections; (its result or the exception it raised, connections closed, requests
    sent again)."""
    async def run():
        async with ClosingProxy(server.port, drops=drops) as proxy:
            # requests go to the proxy's address; the server itself is the fixture's to stop
            upstreams = Upstreams(Upstream(SimpleNamespace(url=proxy.url), 0, "base", None))
            try:
                return await call(upstreams), proxy.dropped, upstreams.resent
            except UpstreamError as exc:
                return exc, proxy.dropped, upstreams.resent
            finally:
                await upstreams._http.aclose()
    return asyncio.run(run())


async def _generate(upstreams: Upstreams):
    return await upstreams.generate(REQUEST)


async def _stream(upstreams: Upstreams):
    return [(text, ids) async for text, ids, _ in upstreams.stream(REQUEST)]


def test_a_generation_whose_connection_closes_unanswered_is_sent_again(server):
    alone, _, _ = _through(server, 0, _generate)
    result, dropped, resent = _through(server, 1, _generate)
    assert (dropped, resent) == (1, 1)
    assert result.token_ids == alone.token_ids and len(result.token_ids) == 8  # greedy
    assert result.policy_version == 0


def test_a_stream_whose_connection_closes_unanswered_is_sent_again(server):
    chunks, dropped, resent = _through(server, 1, _stream)
    assert (dropped, resent) == (1, 1)
    alone, _, _ = _through(server, 0, _generate)
    assert [i for _, ids in chunks for i in ids] == alone.token_ids


@pytest.mark.parametrize("call", [_generate, _stream])
def test_a_second_close_fails_the_call_and_names_it(server, call):
    error, dropped, resent = _through(server, 2, call)
    assert isinstance(error, UpstreamError)
    assert "policy_version 0" in str(error) and "RemoteProtocolError" in str(error)
    assert (dropped, resent) == (2, 1)

