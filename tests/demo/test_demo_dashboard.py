"""The demo's live view without a terminal (`make demo > demo.log`): a plain status line at
the start, every 30 s of the clock, and at the end; the rich table only on a terminal."""

from __future__ import annotations

import io
import time

from rich.console import Console

from demo.dashboard import PlainStatus, live_view
from demo.monitor import HeldOut, Monitor
from demo.traffic import Episode, TrafficStats
from tracetrain.settings import Settings


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _monitor(tmp_path) -> Monitor:
    traffic = TrafficStats()
    for i in range(4):
        traffic.add(Episode(at=time.time(), reward=i / 4, worker=i))
    monitor = Monitor(Settings(home=tmp_path), "http://127.0.0.1:1", "http://127.0.0.1:1",
                      traffic, "exp")
    s = monitor.snapshot
    s.policy_version, s.versions, s.transitions, s.learner_step = 3, 3, 120, 12
    s.learner = {"loss": 0.25}
    s.loads = [{"seconds": 1.5}, {"seconds": 0.5}]
    s.heldout.append(HeldOut("v3", 20, 0.6, time.time()))
    return monitor


def test_without_a_terminal_a_status_line_every_30_s(tmp_path):
    out, clock = io.StringIO(), Clock()
    console = Console(file=out, force_terminal=False, width=60)
    monitor = _monitor(tmp_path)
    view = live_view(console, monitor, "demo", time.time() + 600, 0.145, clock=clock)
    assert isinstance(view, PlainStatus)
    with view:
        for _ in range(95):  # the demo's loop: an update a second, for 95 s
            view.update()
            clock.now += 1.0
    lines = out.getvalue().splitlines()
    assert len(lines) == 5  # at 0, 30, 60 and 90 s, and the last one at the end
    first = lines[0]
    assert first.startswith("demo: 10.0 min left") or first.startswith("demo: 9.9 min left")
    for part in ("rollouts 4", "reward(last 64) 0.375", "transitions 120",
                 "policy v3 served, 3 registered, reload 1.00s avg",
                 "learner step 12 loss 0.2500", "held-out accuracy base 0.145, v3 0.600"):
        assert part in first, (part, first)
    assert len(first) > 60  # one line, not wrapped at the console's width


def test_the_status_line_names_the_task_s_metric(tmp_path):
    """rag is scored by answer F1, not accuracy: the line must not call it accuracy."""
    out = io.StringIO()
    view = live_view(Console(file=out, force_terminal=False, width=60), _monitor(tmp_path),
                     "demo", time.time() + 600, 0.0, clock=Clock(), metric="f1")
    with view:
        view.update()
    assert "held-out f1 base 0.000, v3 0.600" in out.getvalue()
    assert "accuracy" not in out.getvalue()


def test_on_a_terminal_the_table(tmp_path):
    console = Console(file=io.StringIO(), force_terminal=True)
    view = live_view(console, _monitor(tmp_path), "demo", time.time() + 600, None)
    assert not isinstance(view, PlainStatus)
    with view:
        view.update()
    assert "transitions" in console.file.getvalue()
