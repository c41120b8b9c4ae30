"""The versioned names an upstream serves, for upstreams that report no policy version (vLLM):
the reloader loads each LoRA version also as `<name>-v<policy_version>`
(tracetrain/served_names.py); a call for `<name>` is sent to the newest such name, and the
answer's `model` then carries the version onto the span (producers/gateway/capture.py).

The names are read from the upstream's `GET /models` every `gateway.versions_refresh_s`, off
the call path; an upstream that lists no versioned name (the embedded engine, which sends
`X-Policy-Version`) gets every call as sent.
"""

from __future__ import annotations

import logging

import anyio
import httpx

from tracetrain import served_names

log = logging.getLogger(__name__)


class ServedVersions:
    def __init__(self) -> None:
        self.newest: dict[str, str] = {}  # requested name -> its newest versioned name

    def pick(self, model) -> str | None:
        """The versioned name to send a call for `model` to, or None (send it as asked)."""
        return self.newest.get(model) if isinstance(model, str) else None

    def update(self, model_ids: list[str]) -> None:
        best: dict[str, int] = {}
        for served in model_ids:
            parsed = served_names.parse(served) if isinstance(served, str) else None
            if parsed is not None and parsed[1] >= best.get(parsed[0], -1):
                best[parsed[0]] = parsed[1]
        self.newest = {name: served_names.versioned(name, v) for name, v in best.items()}

    async def follow(self, http: httpx.AsyncClient, upstream: str, every_s: float) -> None:
        """Refresh the names every `every_s` until cancelled; an upstream that does not answer
        leaves the names as they were."""
        while True:
            try:
                resp = await http.get(f"{upstream}/models")
                # an error answer (401, 503) with a JSON body is no list of models: keeping
                # the names beats routing to plain `policy` with no version on the spans
                resp.raise_for_status()
                self.update([m.get("id") for m in resp.json().get("data", [])
                             if isinstance(m, dict)])
            except (httpx.HTTPError, ValueError, AttributeError, TypeError) as exc:
                log.debug("the upstream's models could not be read: %r", exc)
            await anyio.sleep(every_s)
