"""The HTTP side of the gateway's engine pool (producers/gateway/pool.py decides; this talks).

- `watch`: one task per engine reads its `/models` every `gateway.versions_refresh_s`, with a
  client of its own (a probe never waits behind calls for a connection) and
  `gateway.probe_timeout_s`: an answer below 500 takes a failed engine back and refreshes its
  versioned names (vLLM), no answer or a 5xx takes it out.
- `send`: a call goes to the engine the pool picks; when that engine fails before the agent
  got any byte of an answer (no connection, a timeout, a 5xx status; a stream's status comes
  before its first byte), the engine is taken out and the call is sent once more, to another
  healthy engine. A 5xx with no other engine to try is passed to the agent as the engine sent
  it. A stream that breaks after its first byte is not sent again (the agent has part of it).
- `PoolCollector`: the pool's figures on the gateway's `/metrics`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import httpx
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from producers.errors import NoHealthyEngine, ProducerError
from producers.gateway import capture
from producers.gateway.pool import Engine, Lease, Pool
from tracetrain.observability import metric_name

log = logging.getLogger(__name__)

Attempt = Callable[[Engine], Awaitable[httpx.Response]]


class Unreachable(ProducerError):
    """Every engine a call was sent to failed before answering; `engine` is the last one."""

    def __init__(self, message: str, engine: Engine):
        self.engine = engine
        super().__init__(message)


@dataclass
class Sent:
    """A call's answer (its status and headers; a stream's body still to come), the engine
    that gave it, and the call's place in that engine's in-flight count."""

    engine: Engine
    lease: Lease
    response: httpx.Response


def is_engine_fault(exc: httpx.HTTPError) -> bool:
    # Every connection of the gateway's own client busy is the gateway's limit, not the engine's.
    return not isinstance(exc, httpx.PoolTimeout)


def take_out(pool: Pool, engine: Engine, reason: str) -> None:
    if pool.failed(engine, reason):
        log.warning("engine %s is out of the pool until a probe answers: %s", engine.url, reason)


async def send(pool: Pool, rollout_id: str | None, attempt: Attempt,
               retry_after_s: float) -> Sent:
    """`attempt` on the engine the pool picks for `rollout_id`, once more on another when that
    one fails before answering. NoHealthyEngine when none could be tried; Unreachable when
    every one tried failed."""
    tried: list[Engine] = []
    reasons: list[str] = []
    for _ in range(2):
        engine = pool.pick(rollout_id, avoid=tried)
        if engine is None:
            break
        if tried:
            tried[-1].retried += 1
        tried.append(engine)
        lease = Lease(engine)
        try:
            response = await attempt(engine)
        except httpx.HTTPError as exc:
            lease.release()
            reasons.append(f"{engine.url} unreachable: {exc!r}")
            if is_engine_fault(exc):
                take_out(pool, engine, f"call failed: {exc!r}")
            continue
        except BaseException:  # cancelled (the client left): the place is given back
            lease.release()
            raise
        if response.status_code >= 500:
            take_out(pool, engine, f"answered a call with {response.status_code}")
            if len(tried) < 2 and pool.can_retry(tried):
                await response.aclose()
                lease.release()
                reasons.append(f"{engine.url} answered {response.status_code}")
                continue
        return Sent(engine, lease, response)
    if not tried:
        raise NoHealthyEngine(pool.unavailable(), retry_after_s)
    raise Unreachable(f"upstream {'; then upstream '.join(reasons)}", tried[-1])


def call_attempt(http: httpx.AsyncClient, kind: str, path: str, body: dict, ask: bool,
                 stream: bool) -> Attempt:
    """The attempt of one chat or completion call, as each engine is to get it: for `policy`
    the engine's own newest versioned name (vLLM), token ids and logprobs asked for unless the
    engine refused them before."""

    async def attempt(engine: Engine) -> httpx.Response:
        served = engine.versions.pick(body.get("model"))
        forwarded = body if served is None else {**body, "model": served}
        sent = capture.prepare_request(kind, forwarded, ask and not engine.refuses_token_ids)
        response = await _post(http, engine.url + path, sent, stream)
        if sent != forwarded and response.status_code == 400 and \
                await _refuses_our_fields(response):
            # An upstream that rejects return_token_ids (OpenAI itself, strict servers):
            # remember it and send the client's body unchanged from now on.
            engine.refuses_token_ids = True
            response = await _post(http, engine.url + path, forwarded, stream)
        return response

    return attempt


async def _post(http: httpx.AsyncClient, url: str, payload: dict,
                stream: bool) -> httpx.Response:
    return await http.send(http.build_request("POST", url, json=payload), stream=stream)


async def _refuses_our_fields(response: httpx.Response) -> bool:
    text = (await response.aread()).decode(errors="replace")
    await response.aclose()
    return "return_token_ids" in text


async def probe(pool: Pool, engine: Engine, http: httpx.AsyncClient) -> None:
    """One read of the engine's `/models`: in or out of the pool, and its versioned names."""
    try:
        response = await http.get(f"{engine.url}/models")
    except httpx.HTTPError as exc:
        take_out(pool, engine, f"probe of /models failed: {exc!r}")
        return
    if response.status_code >= 500:
        take_out(pool, engine, f"probe of /models answered {response.status_code}")
        return
    if pool.answered(engine):
        log.warning("engine %s answers again: back in the pool", engine.url)
    if response.status_code >= 400:
        # an error answer (401) with a JSON body is no list of models: keeping the names
        # beats routing to plain `policy` with no version on the spans
        log.debug("the models of %s: %s", engine.url, response.status_code)
        return
    try:
        engine.versions.update([m.get("id") for m in response.json().get("data", [])
                                if isinstance(m, dict)])
    except (ValueError, AttributeError, TypeError) as exc:
        log.debug("the models of %s could not be read: %r", engine.url, exc)


async def watch(pool: Pool, http: httpx.AsyncClient, every_s: float) -> None:
    """Probe every engine every `every_s` until cancelled, all at once (one slow engine does
    not delay the others' return)."""
    while True:
        async with anyio.create_task_group() as group:
            for engine in pool.engines:
                group.start_soon(_probe_logged, pool, engine, http)
        await anyio.sleep(every_s)


async def _probe_logged(pool: Pool, engine: Engine, http: httpx.AsyncClient) -> None:
    try:
        await probe(pool, engine, http)
    except Exception:  # a fault here must not end the probing: no engine would come back
        log.exception("the probe of %s failed unexpectedly", engine.url)


class PoolCollector:
    """The pool's figures, read when /metrics is scraped (the pool keeps plain counts)."""

    def __init__(self, pool: Pool):
        self.pool = pool

    def collect(self):
        families = [
            (GaugeMetricFamily, "upstream_in_flight", "calls", "Calls an engine is answering now.",
             lambda e: e.in_flight),
            (GaugeMetricFamily, "upstream_healthy", "value", "1 while the engine takes calls, "
             "0 while it is out (it failed a call or a probe; back once a probe answers).",
             lambda e: int(e.healthy)),
            (CounterMetricFamily, "upstream_sent", "calls", "Calls sent to the engine, retries "
             "included.", lambda e: e.sent),
            (CounterMetricFamily, "upstream_failed", "events", "Calls and probes the engine "
             "failed (no connection, a timeout, a 5xx).", lambda e: e.failures),
            (CounterMetricFamily, "upstream_outages", "events", "Times the engine was taken out "
             "of the pool.", lambda e: e.outages),
            (CounterMetricFamily, "retried", "calls", "Calls the engine failed before answering "
             "that were sent again to another engine.", lambda e: e.retried),
        ]
        for kind, what, unit, doc, value in families:
            family = kind(metric_name("gateway", what, unit), doc, labels=["upstream"])
            for engine in self.pool.engines:
                family.add_metric([engine.url], value(engine))
            yield family
