"""Duplicate transitions, recognised exactly in bounded memory and across restarts.

    window = DedupeWindow(settings.learner.dedupe_window)
    verdict = window.check(transition)     # None (new), DUPLICATE or BEYOND_WINDOW
    window.add(transition)                 # once it is accepted

The window remembers the last `capacity` accepted transition ids with their `emitted_ns` (the
streams stage sets it from the record that closed the rollout, so a re-emitted copy carries the
same value), and `horizon_ns`, the newest `emitted_ns` of the ids it has forgotten. An id not in
the window whose `emitted_ns` is after the horizon cannot be a copy of a forgotten one: it is
new. One at or before the horizon may be a copy: it falls outside the window and the batcher
dead-letters it (BEYOND_WINDOW, counted) rather than train it perhaps twice; it stays on the
DLQ for an operator. A transition without `emitted_ns` (0: not made by the streams stage) is
checked against the window alone. The state is part of every checkpoint.
"""

from __future__ import annotations

from collections import OrderedDict

DUPLICATE, BEYOND_WINDOW = "duplicate", "beyond_dedupe_window"


class DedupeWindow:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.emitted: OrderedDict[str, int] = OrderedDict()  # id -> emitted_ns, oldest first
        self.horizon_ns = 0

    def __contains__(self, transition_id: str) -> bool:
        return transition_id in self.emitted

    def check(self, t: dict) -> str | None:
        if t["transition_id"] in self.emitted:
            return DUPLICATE
        emitted = t.get("emitted_ns") or 0
        if emitted and emitted <= self.horizon_ns:
            return BEYOND_WINDOW
        return None

    def add(self, t: dict) -> None:
        self.emitted[t["transition_id"]] = t.get("emitted_ns") or 0
        self._evict()

    def _evict(self) -> None:
        while len(self.emitted) > self.capacity:
            _, emitted = self.emitted.popitem(last=False)
            self.horizon_ns = max(self.horizon_ns, emitted)

    def state_dict(self) -> dict:
        return {"ids": list(self.emitted), "emitted_ns": list(self.emitted.values()),
                "horizon_ns": self.horizon_ns}

    def load_state_dict(self, state: dict) -> None:
        self.emitted = OrderedDict(zip(state["ids"], state["emitted_ns"], strict=True))
        self.horizon_ns = state["horizon_ns"]
        self._evict()  # a smaller window than the checkpoint's
