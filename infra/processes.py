"""Supervision of the stack's processes: each one is started detached, with its log, pid file
and health URL under the state folder, so `tracetrain status` and `down` can find it later
from another shell. Only processes with our pid files are ever stopped.
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


@dataclass
class ProcessRecord:
    name: str
    pid: int
    argv: list[str]
    address: str
    health_url: str | None
    log: str
    started: float


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


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def require_free(host: str, port: int, what: str) -> None:
    if port_in_use(host, port):
        raise InfraError(
            f"port {host}:{port} for {what} is already taken; stop what holds it "
            f"(`ss -ltnp | grep {port}`) or choose another port in settings"
        )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still answers kill(0); reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def spawn(
    home: Path,
    name: str,
    argv: list[str],
    *,
    address: str,
    health_url: str | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> ProcessRecord:
    """Start `argv` in its own session (so a terminal's Ctrl-C does not reach it)."""
    existing = read_record(home, name)
    if existing and pid_alive(existing.pid):
        raise InfraError(f"{name} is already running (pid {existing.pid}); `tracetrain down` first")
    log_path = log_dir(home) / f"{name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
    record = ProcessRecord(name, proc.pid, argv, address, health_url, str(log_path), time.time())
    (run_dir(home) / f"{name}.json").write_text(json.dumps(asdict(record)))
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
    """SIGTERM the process group, SIGKILL after `timeout_s`. False if nothing was running."""
    record = read_record(home, name)
    if record is None:
        return False
    was_alive = pid_alive(record.pid)
    if was_alive:
        _signal_group(record.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while pid_alive(record.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(record.pid):
            _signal_group(record.pid, signal.SIGKILL)
            while pid_alive(record.pid):
                time.sleep(0.05)
    (run_dir(home) / f"{name}.json").unlink(missing_ok=True)
    return was_alive


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(os.getpgid(pid), sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def healthy(record: ProcessRecord) -> bool:
    if not pid_alive(record.pid):
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
            raise InfraError(f"{what} exited during start-up{_tail(log)}")
        time.sleep(0.25)
    raise InfraError(f"{what} did not become ready within {timeout_s:.0f}s{_tail(log)}")


def _tail(log: str | None, lines: int = 15) -> str:
    if not log or not Path(log).is_file():
        return ""
    text = Path(log).read_text(errors="replace").splitlines()[-lines:]
    return f"; last lines of {log}:\n    " + "\n    ".join(text)
