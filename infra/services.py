"""One way to declare and start a long-running process of the pipeline.

Each stage declares its process once, in `STAGE/service.py`, as a `Service`: its name, the
command that runs it, the address it listens on, its health URL, how long it may take to
start, and what it reads and writes. `start` is the one spawner: it checks the port is free,
passes the whole settings object to the child through the environment (`settings_env`, the
one encoder), starts the process detached with its log and pid file under the state folder
(a service declared `restart=True` under `infra/supervise.py`, which starts it again when it
dies), and waits until its health URL answers (or shows the log's tail if it dies or never
does).
`stop` ends it. `tracetrain up --services`, the demo, `tracetrain eval`, the benchmarks and the
tests all start processes through here; the stack's list of services is `infra.stack.SERVICES`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from infra import processes
from tracetrain.settings import ENV_PREFIX, Settings, settings_env

# The repository (or site-packages) folder holding the stage packages: children run with it
# as their working directory so `python -m bench.X` style commands resolve the same way.
ROOT = Path(__file__).resolve().parent.parent


def cli(*command: str) -> list[str]:
    """The argv of a `tracetrain COMMAND ...` child, with this interpreter (the venv's)."""
    return [sys.executable, "-m", "tracetrain.cli", *command]


def _no_env(settings: Settings) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class Service:
    """A long-running process, declared once by its stage."""

    name: str
    summary: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    argv: Callable[[Settings], list[str]]
    # (host, port) the process binds, checked free before it starts; None: it binds nothing.
    listen: Callable[[Settings], tuple[str, int] | None]
    # The page at that address that answers < 500 once the process is ready; None (or no
    # address): ready once spawned.
    health_path: str | None
    start_timeout_s: Callable[[Settings], float]
    # Extra variables beyond the settings (e.g. vLLM's runtime-LoRA switches).
    env: Callable[[Settings], dict[str, str]] = _no_env
    # Started again when it ends other than by a stop (infra/supervise.py): for a process
    # that exits on purpose when going on would lose data.
    restart: bool = False
    # The setting that chooses the port (`gateway.port`): named when the port is taken.
    port_setting: str | None = None

    def address(self, settings: Settings) -> str:
        bound = self.listen(settings)
        return f"{bound[0]}:{bound[1]}" if bound else "-"

    def health_url(self, settings: Settings) -> str | None:
        bound = self.listen(settings)
        if bound is None or self.health_path is None:
            return None
        return f"http://{bound[0]}:{bound[1]}{self.health_path}"


def status_address(host: str, port: int) -> tuple[str, int] | None:
    """Where a process's status server (`tracetrain.observability.StatusServer`) listens; None
    for port 0, a free port chosen at start (tests): unknown beforehand, so the process counts
    as ready once spawned."""
    return (host, port) if port else None


def child_env(settings: Settings, extra: dict[str, str] | None = None) -> dict[str, str | None]:
    """The environment changes of a stage's process: its settings exactly as the parent holds
    them, and every other `TRACETRAIN_*` variable of the parent removed (None), since a nested
    one such as TRACETRAIN_ENGINE__PORT would override the section the parent chose (an eval
    engine on a free port would take the stack's port instead)."""
    inherited = {k: None for k in os.environ if k.upper().startswith(ENV_PREFIX)}
    return {**inherited, **settings_env(settings), **(extra or {})}


def start(settings: Settings, service: Service, *, instance: str | None = None,
          extra_argv: Sequence[str] = (), wait: bool = True) -> processes.ProcessRecord:
    """Start `service` detached; with `wait`, return once it is healthy.

    `instance` names the pid file and log when several copies run from one state folder
    (two streams workers, an eval engine beside the demo's); it defaults to the service name.
    """
    name = instance or service.name
    bound = service.listen(settings)
    if bound is not None:
        processes.require_free(bound[0], bound[1], name, service.port_setting)
    argv = [*service.argv(settings), *extra_argv]
    if service.restart:
        argv = [sys.executable, "-m", "infra.supervise", "--name", name, "--", *argv]
    record = processes.spawn(
        settings.home_dir, name, argv,
        address=service.address(settings), health_url=service.health_url(settings),
        env=child_env(settings, service.env(settings)), cwd=ROOT)
    if wait and record.health_url is not None:
        try:
            processes.wait_until(lambda: processes.healthy(record),
                                 service.start_timeout_s(settings), name, log=record.log,
                                 alive=lambda: processes.pid_alive(record.pid))
        except BaseException:
            # A process that missed its start-up bound, or whose caller was stopped meanwhile
            # (Ctrl-C, SIGTERM in the demo), must not linger holding its port.
            processes.stop(settings.home_dir, name, timeout_s=5)
            raise
    return record


def stop(settings: Settings, name: str, timeout_s: float = 20.0) -> bool:
    """SIGTERM the named process (SIGKILL after `timeout_s`); False if it was not running."""
    return processes.stop(settings.home_dir, name, timeout_s=timeout_s)
