"""The demo's live terminal view (rich): one table redrawn every couple of seconds."""

from __future__ import annotations

import time

from rich.console import Group
from rich.panel import Panel
from rich.table import Table

from demo.monitor import Monitor


def _fmt(value, spec: str = ".3f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def render(monitor: Monitor, title: str, ends_at: float, base_accuracy: float | None) -> Panel:
    s = monitor.snapshot
    left = max(0.0, ends_at - time.time())
    table = Table.grid(padding=(0, 3))
    table.add_column(justify="right", style="bold")
    table.add_column()
    table.add_row("rollouts/s", _fmt(monitor.rollouts_per_s(), ".2f"))
    table.add_row("transitions", f"{s.transitions} ({s.transitions_per_s:.2f}/s)")
    table.add_row("reward (last 64)", _fmt(monitor.moving_reward()))
    table.add_row("rollouts", f"{len(monitor.traffic.episodes)}"
                  + (f"  [red]{monitor.traffic.errors} agent errors: {monitor.traffic.last_error}[/]"
                     if monitor.traffic.errors else ""))
    table.add_row("policy version", f"{_fmt(s.policy_version, 'd')} served, {s.versions} registered"
                  + (f", reload {monitor.mean_reload_s():.2f}s avg" if s.loads else ""))
    learner = s.learner
    table.add_row("learner", f"step {_fmt(s.learner_step, 'd')}  loss {_fmt(learner.get('loss'), '.4f')}"
                  f"  staleness {_fmt(learner.get('staleness'), '.2f')}"
                  f"  batch reward {_fmt(learner.get('mean_reward'))}")
    held = Table("version", "held-out accuracy", "n", box=None, header_style="bold")
    if base_accuracy is not None:
        held.add_row("base", f"{base_accuracy:.3f}", "")
    for h in s.heldout[-8:]:
        held.add_row(h.version, f"{h.accuracy:.3f}", str(h.n))
    return Panel(Group(table, held), title=title,
                 subtitle=f"{left / 60:.1f} min left  (Ctrl-C ends it early)")
