"""The engines behind the gateway, and which of them takes a call. Pure: no I/O; the HTTP side
(probes, sending with one retry, metrics) is producers/gateway/upstreams.py.

- A rollout's calls go to the engine its first call went to while that engine is healthy: its
  prefix cache holds the rollout's growing prompt, so each turn computes only what is new. A
  rollout is remembered `gateway.sticky_ttl_s` after its last call, at most
  `gateway.sticky_max` of them, the longest idle forgotten first.
- A rollout the pool does not remember, or whose engine is out, goes to the healthy engine
  with the fewest calls in flight, ties taken in turn (a quiet pool still spreads its
  rollouts), and stays there: moving back once its first engine returns would cost a second
  cold cache.
- An engine that fails a call or a probe (no connection, a timeout, a 5xx answer) is out, and
  gets no call until a probe answers.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from producers.gateway.versions import ServedVersions


@dataclass(eq=False)
class Engine:
    url: str
    healthy: bool = True
    in_flight: int = 0
    sent: int = 0          # calls sent to it, retries included
    failures: int = 0      # its failed calls and probes
    outages: int = 0       # times it was taken out
    retried: int = 0       # calls it failed that were sent again to another engine
    last_error: str | None = None
    down_since: float | None = None
    versions: ServedVersions = field(default_factory=ServedVersions)  # vLLM's `policy-v<N>`
    refuses_token_ids: bool = False  # a strict OpenAI-compatible server (see app.py)

    def view(self, now: float) -> dict:
        """What /state shows of it."""
        return {"url": self.url, "healthy": self.healthy, "in_flight": self.in_flight,
                "sent": self.sent, "failures": self.failures, "outages": self.outages,
                "retried": self.retried, "last_error": self.last_error,
                "down_for_s": None if self.down_since is None else round(now - self.down_since, 3),
                "served_versions": dict(self.versions.newest)}


class Lease:
    """One call's place in its engine's in-flight count, given back exactly once however the
    call ends (answered, failed, the client gone mid-stream)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        engine.in_flight += 1
        engine.sent += 1
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self.engine.in_flight -= 1


class Pool:
    def __init__(self, urls: list[str], sticky_ttl_s: float, sticky_max: int,
                 clock: Callable[[], float] = time.monotonic):
        if not urls:
            raise ValueError("a pool needs at least one engine URL")
        self.engines = [Engine(url) for url in urls]
        self.sticky_ttl_s, self.sticky_max, self.clock = sticky_ttl_s, sticky_max, clock
        # rollout id -> (its engine, time of its last call), least recently used first
        self._rollouts: OrderedDict[str, tuple[Engine, float]] = OrderedDict()
        self._turn = 0  # where the next tie-break starts

    # ---- routing ----------------------------------------------------------------------------
    def pick(self, rollout_id: str | None, avoid: Collection[Engine] = ()) -> Engine | None:
        """The engine for a call of `rollout_id` (None: a call of no rollout, e.g. /models),
        never one of `avoid`; None when no healthy engine is left."""
        now = self.clock()
        self._forget_idle(now)
        held = self._rollouts.get(rollout_id) if rollout_id is not None else None
        if held is not None and held[0].healthy and held[0] not in avoid:
            engine = held[0]
        else:
            engine = self._least_loaded(avoid)
            if engine is None:
                return None
        if rollout_id is not None:
            self._rollouts[rollout_id] = (engine, now)
            self._rollouts.move_to_end(rollout_id)
            while len(self._rollouts) > self.sticky_max:
                self._rollouts.popitem(last=False)
        return engine

    def can_retry(self, avoid: Collection[Engine]) -> bool:
        return any(e.healthy and e not in avoid for e in self.engines)

    def _least_loaded(self, avoid: Collection[Engine]) -> Engine | None:
        count = len(self.engines)
        in_turn = [self.engines[(self._turn + i) % count] for i in range(count)]
        candidates = [e for e in in_turn if e.healthy and e not in avoid]
        if not candidates:
            return None
        best = min(candidates, key=lambda e: e.in_flight)  # the first of equals, in turn
        self._turn = (self.engines.index(best) + 1) % count
        return best

    def _forget_idle(self, now: float) -> None:
        while self._rollouts:
            _engine, last = next(iter(self._rollouts.values()))
            if now - last <= self.sticky_ttl_s:
                return
            self._rollouts.popitem(last=False)

    def engine_of(self, rollout_id: str) -> Engine | None:
        """The engine remembered for `rollout_id` (tests, /state), healthy or not."""
        held = self._rollouts.get(rollout_id)
        return held[0] if held is not None else None

    # ---- health -----------------------------------------------------------------------------
    def failed(self, engine: Engine, reason: str) -> bool:
        """`engine` failed a call or a probe: it is out. True if it was in until now."""
        engine.failures += 1
        engine.last_error = reason
        if not engine.healthy:
            return False
        engine.healthy, engine.down_since = False, self.clock()
        engine.outages += 1
        return True

    def answered(self, engine: Engine) -> bool:
        """A probe of `engine` answered: it is in. True if it was out until now."""
        if engine.healthy:
            return False
        engine.healthy, engine.down_since = True, None
        return True

    # ---- what the pool says of itself -------------------------------------------------------
    def unavailable(self) -> str:
        """Why no engine can take a call, naming each."""
        now = self.clock()
        out = [f"{e.url} (out for {now - (e.down_since or now):.1f}s: {e.last_error})"
               for e in self.engines if not e.healthy]
        return f"no healthy engine in the gateway's pool: {', '.join(out)}"

    def state(self) -> dict:
        now = self.clock()
        return {"engines": [e.view(now) for e in self.engines],
                "healthy": sum(e.healthy for e in self.engines),
                "rollouts_remembered": len(self._rollouts)}

    def newest_versions(self) -> dict[str, str]:
        """Model -> the newest versioned name any engine serves (vLLM; see versions.py)."""
        pooled = ServedVersions()
        pooled.update([name for e in self.engines for name in e.versions.newest.values()])
        return pooled.newest
