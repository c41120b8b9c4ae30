"""The versioned names an upstream serves, for upstreams that report no policy version (vLLM):
the reloader loads each LoRA version also as `<name>-v<policy_version>`
(tracetrain/served_names.py); a call for `<name>` is sent to the newest such name, and the
answer's `model` then carries the version onto the span (producers/gateway/capture.py).

Each engine of the pool has its own (a reloader rolls a version through the pool one engine at
a time), read from its `GET /models` every `gateway.versions_refresh_s`, off the call path, by
the probe of producers/gateway/upstreams.py; an upstream that lists no versioned name (the
embedded engine, which sends `X-Policy-Version`) gets every call as sent.
"""

from __future__ import annotations

from tracetrain import served_names


class ServedVersions:
    def __init__(self) -> None:
        self.newest: dict[str, str] = {}  # requested name -> its newest versioned name

    def pick(self, model) -> str | None:
        """The versioned name to send a call for `model` to, or None (send it as asked)."""
        return self.newest.get(model) if isinstance(model, str) else None

    def update(self, model_ids: list) -> None:
        best: dict[str, int] = {}
        for served in model_ids:
            parsed = served_names.parse(served) if isinstance(served, str) else None
            if parsed is not None and parsed[1] >= best.get(parsed[0], -1):
                best[parsed[0]] = parsed[1]
        self.newest = {name: served_names.versioned(name, v) for name, v in best.items()}
