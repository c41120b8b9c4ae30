"""Supervision of the stack's processes: each one is started detached, with its log, pid file
and health URL under the state folder, so `tracetrain status` and `down` can find it later
from another shell.

Only processes we started are ever signalled. A pid file records the argv and the process's
start time (in clock ticks since boot, from `/proc/PID/stat`, with the boot id); before any
signal `/proc` must still show that start time and that command line. A pid the kernel has
since given to another process (the stack died, the machine rebooted) is left alone and its
stale pid file removed. A zombie (exited, not yet reaped by a parent that is still alive)
counts as exited, so stopping it never waits for it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from tracetrain.errors import InfraError
from tracetrain.settings import env_name


@dataclass
class ProcessRecord:
    name: str
    pid: int
    argv: list[str]
    address: str
    health_url: str | None
    log: str
    started: float
    # /proc/PID/stat's start time (clock ticks since boot) and the boot it counts from: with
    # the pid, what identifies the process we started. None in pid files from before.
    start_ticks: int | None = None
    boot_id: str | None = None


def run_dir(home: Path) -> Path:
    path = Path(home) / "run"
    path.mkdir(parents=True, exist_ok=True)
    return path


def log_dir(home: Path) -> Path:
    path = Path(home) / "logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


# Ports are handed out below the kernel's ephemeral range: a port from bind(0) lies inside it,
# and between the check and the server's bind any outgoing connection (a broker dialling its
# peers, a client) may take it as its local port; a 3-broker test once failed so, a broker
# unable to bind its controller port. Walking from a random start, one process never hands
# out a port twice (two servers of one test cannot be given the same one).
_PORTS_FROM = 20000
_cursor: list[int] = []


def free_ports(n: int = 1, host: str = "127.0.0.1") -> int:
    """The first of `n` consecutive free ports (brokers listen on port + i)."""
    floor = _ephemeral_floor()
    span = max(floor - _PORTS_FROM, n + 1)
    if not _cursor:
        _cursor.append(int.from_bytes(os.urandom(4), "little") % span)
    for _ in range(span):
        first = _PORTS_FROM + _cursor[0] % span
        _cursor[0] = (_cursor[0] + n) % span
        if first + n <= _PORTS_FROM + span and all(_bindable(host, first + i) for i in range(n)):
            return first
    raise InfraError(f"no {n} consecutive free ports on {host} in {_PORTS_FROM}-{floor - 1}")


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def require_free(host: str, port: int, what: str, setting: str | None = None) -> None:
    """InfraError naming the port, what wanted it and the setting that chose it (a dotted
    path, 'gateway.port'), if something already listens there."""
    if port_in_use(host, port):
        variable = env_name(setting) if setting else None
        raise InfraError(
            f"port {host}:{port} for {what} is already taken"
            + (f" (setting {setting}, {variable})" if setting else "")
            + f"; stop what holds it (`ss -ltnp | grep {port}`) or "
            + (f"set {variable} to another port" if variable else "choose another port")
        )


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in ticks since boot) from /proc/PID/stat; None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: fields follow the last ')'.
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return raw.decode(errors="surrogateescape").split("\0")[:-1]


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def pid_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie is exited (reaped here when it is our child)."""
    stat = _stat(pid)
    if stat is None:
        return False
    if stat[0] in "ZX":
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass  # someone else's child: its parent reaps it
        return False
    return True


def is_ours(record: ProcessRecord) -> bool:
    """True while the process `record` names runs and is the one we started.

    With a recorded start time, the same start time since the same boot: a pid the kernel gave
    to another process has another. (A process may rewrite its command line, as vLLM and
    gunicorn do with setproctitle; it cannot change its start time.) A pid file without one
    (written before start times were recorded) needs the same command line instead; a script's
    interpreter may stand before it."""
    stat = _stat(record.pid)
    if stat is None or not pid_alive(record.pid):  # gone, or a zombie (reaped if ours)
        return False
    if record.start_ticks is not None:
        return stat[1] == record.start_ticks and record.boot_id == _boot_id()
    cmdline = _cmdline(record.pid) or []
    return cmdline[len(cmdline) - len(record.argv):] == record.argv


def environ_with(changes: dict[str, str | None] | None) -> dict[str, str]:
    """This process's environment with `changes`; a None value removes the variable."""
    return {k: v for k, v in {**os.environ, **(changes or {})}.items() if v is not None}


def spawn(
    home: Path,
    name: str,
    argv: list[str],
    *,
    address: str,
    health_url: str | None = None,
    env: dict[str, str | None] | None = None,
    cwd: Path | None = None,
) -> ProcessRecord:
    """Start `argv` in its own session (so a terminal's Ctrl-C does not reach it)."""
    existing = read_record(home, name)
    if existing and is_ours(existing):
        raise InfraError(f"{name} is already running (pid {existing.pid}); `tracetrain down` first")
    log_path = log_dir(home) / f"{name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=environ_with(env),
            cwd=cwd,
            start_new_session=True,
        )
    try:
        # Popen returns once the child has exec'd, so /proc already shows its final argv.
        stat = _stat(proc.pid)
        record = ProcessRecord(name, proc.pid, argv, address, health_url, str(log_path),
                               time.time(), start_ticks=stat[1] if stat else None,
                               boot_id=_boot_id())
        (run_dir(home) / f"{name}.json").write_text(json.dumps(asdict(record)))
    except BaseException:
        # Without its pid file (Ctrl-C or SIGTERM right now, a full disk) nothing else could
        # ever find the child to stop it.
        proc.kill()
        raise
    return record


def read_record(home: Path, name: str) -> ProcessRecord | None:
    path = run_dir(home) / f"{name}.json"
    if not path.is_file():
        return None
    return ProcessRecord(**json.loads(path.read_text()))


def records(home: Path) -> list[ProcessRecord]:
    found = []
    for path in sorted(run_dir(home).glob("*.json")):
        found.append(ProcessRecord(**json.loads(path.read_text())))
    return found


def stop(home: Path, name: str, timeout_s: float = 20.0) -> bool:
    """SIGTERM the process group, SIGKILL after `timeout_s`. False if nothing of ours was
    running (no pid file, the process exited, or its pid now belongs to another process)."""
    record = read_record(home, name)
    if record is None:
        return False
    was_ours = is_ours(record)
    if was_ours:
        _signal(record, signal.SIGTERM)
        if not _wait_gone(record, timeout_s):
            _signal(record, signal.SIGKILL)
            if not _wait_gone(record, 10.0):
                raise InfraError(f"{name} (pid {record.pid}) survived SIGKILL for 10 s "
                                 f"(uninterruptible I/O?); its pid file stays: {run_dir(home)}")
    (run_dir(home) / f"{name}.json").unlink(missing_ok=True)
    return was_ours


def _wait_gone(record: ProcessRecord, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while is_ours(record):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _signal(record: ProcessRecord, sig: int) -> None:
    """Signal the process group we started (its leader is the process), checked just before."""
    if not is_ours(record):
        return
    try:
        # start_new_session made the process its group's leader; a group led by another
        # pid is not ours to signal, so then only the process itself is.
        if os.getpgid(record.pid) == record.pid:
            os.killpg(record.pid, sig)
        else:
            os.kill(record.pid, sig)
    except ProcessLookupError:
        pass


def healthy(record: ProcessRecord) -> bool:
    if not is_ours(record):
        return False
    if record.health_url is None:
        host, _, port = record.address.rpartition(":")
        return port_in_use(host or "127.0.0.1", int(port)) if port.isdigit() else True
    try:
        return httpx.get(record.health_url, timeout=2.0).status_code < 500
    except httpx.HTTPError:
        return False


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, log: str | None = None,
               alive: Callable[[], bool] | None = None) -> None:
    """Poll `check` until true; on time-out (or death, via `alive`) show the log's tail."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        if alive is not None and not alive():
            raise InfraError(f"{what} exited during start-up{log_tail(log)}")
        time.sleep(0.25)
    raise InfraError(f"{what} did not become ready within {timeout_s:.0f}s{log_tail(log)}")


def log_tail(log: str | None, lines: int = 15) -> str:
    if not log or not Path(log).is_file():
        return ""
    text = Path(log).read_text(errors="replace").splitlines()
    # A JVM's last lines are often the tail of a stack trace; its first ERROR line, and the
    # exception printed under it, say why.
    at = next((i for i, line in enumerate(text[:-lines]) if " ERROR " in line), None)
    first_error = text[at:at + 2] if at is not None else []
    return ((f"; first error in {log}:\n    " + "\n    ".join(first_error) if first_error else "")
            + f"; last lines of {log}:\n    " + "\n    ".join(text[-lines:]))
