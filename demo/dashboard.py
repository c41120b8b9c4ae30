"""The demo's live view: on a terminal, one rich table redrawn every couple of seconds; without
one (`make demo > demo.log`), one plain status line every 30 s, because rich's Live draws
only on a terminal and a piped demo would print nothing during its traffic.

    with live_view(console, monitor, title, ends_at, base_accuracy) as view:
        while running:
            view.update()
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from demo.monitor import Monitor


def _fmt(value, spec: str = ".3f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def render(monitor: Monitor, title: str, ends_at: float, base_accuracy: float | None,
           metric: str = "accuracy") -> Panel:
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
    held = Table("version", f"held-out {metric}", "n", box=None, header_style="bold")
    if base_accuracy is not None:
        held.add_row("base", f"{base_accuracy:.3f}", "")
    for h in s.heldout[-8:]:
        held.add_row(h.version, f"{h.accuracy:.3f}", str(h.n))
    return Panel(Group(table, held), title=title,
                 subtitle=f"{left / 60:.1f} min left  (Ctrl-C ends it early)")


def status_line(monitor: Monitor, ends_at: float, base_accuracy: float | None,
                metric: str = "accuracy") -> str:
    """The dashboard's figures on one plain line."""
    s = monitor.snapshot
    left = max(0.0, ends_at - time.time())
    reload = monitor.mean_reload_s()
    held = ", ".join([*([f"base {base_accuracy:.3f}"] if base_accuracy is not None else []),
                      *(f"{h.version} {h.accuracy:.3f}" for h in s.heldout[-3:])])
    parts = [
        f"{left / 60:.1f} min left",
        f"rollouts {len(monitor.traffic.episodes)} ({monitor.rollouts_per_s():.2f}/s)",
        f"reward(last 64) {_fmt(monitor.moving_reward())}",
        f"transitions {s.transitions}",
        f"policy v{_fmt(s.policy_version, 'd')} served, {s.versions} registered"
        + (f", reload {reload:.2f}s avg" if reload is not None else ""),
        f"learner step {_fmt(s.learner_step, 'd')} loss {_fmt(s.learner.get('loss'), '.4f')}",
    ]
    if held:
        parts.append(f"held-out {metric} {held}")
    if monitor.traffic.errors:
        parts.append(f"{monitor.traffic.errors} agent errors")
    return "demo: " + " | ".join(parts)


class PlainStatus:
    """`status_line()` printed every `every_s` seconds of `clock`, at the first update and once
    more at the end; flushed, so a file shows it at once."""

    def __init__(self, console: Console, line: Callable[[], str], every_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic):
        self.console, self.line, self.every_s, self.clock = console, line, every_s, clock
        self._printed_at: float | None = None

    def __enter__(self) -> PlainStatus:
        return self

    def __exit__(self, *exc) -> None:
        self._print()

    def update(self) -> None:
        if self._printed_at is None or self.clock() - self._printed_at >= self.every_s:
            self._print()

    def _print(self) -> None:
        self._printed_at = self.clock()
        # soft_wrap: a file gets the whole line, not rich's 80 columns
        self.console.print(self.line(), markup=False, highlight=False, soft_wrap=True)
        self.console.file.flush()


class _LiveTable:
    """rich's Live with `render()`'s table, redrawn on each update."""

    def __init__(self, console: Console, draw: Callable[[], Panel]):
        self.draw = draw
        self.live = Live(draw(), console=console, refresh_per_second=1, transient=False)

    def __enter__(self) -> _LiveTable:
        self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.live.__exit__(*exc)

    def update(self) -> None:
        self.live.update(self.draw())


def live_view(console: Console, monitor: Monitor, title: str, ends_at: float,
              base_accuracy: float | None, every_s: float = 30.0,
              clock: Callable[[], float] = time.monotonic,
              metric: str = "accuracy") -> _LiveTable | PlainStatus:
    """The table on a terminal; otherwise a status line every `every_s` seconds."""
    if console.is_terminal:
        return _LiveTable(console, lambda: render(monitor, title, ends_at, base_accuracy, metric))
    return PlainStatus(console, lambda: status_line(monitor, ends_at, base_accuracy, metric),
                       every_s, clock)
