"""Stopping only what we started, as a user runs it: `tracetrain down` and `smoke` against real
processes whose pid files lie (a pid reused), whose process is a zombie, or that another
command started; a port already taken names the port and the setting."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra import processes
from infra.services import ROOT
from tests.infra.test_stack_cli import TRACETRAIN, _env


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


@pytest.fixture
def bystander():
    """A process nobody's `up` started (its own session, so a group signal would reach it
    alone); it must survive every test below."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _pid_file(home: Path, fields: dict) -> None:
    (processes.run_dir(home) / f"{fields['name']}.json").write_text(json.dumps(fields))


@pytest.mark.faults
@pytest.mark.parametrize("legacy", [True, False], ids=["old-pid-file", "pid-file-with-start"])
def test_down_never_signals_a_process_that_reused_our_pid(tmp_path, bystander, legacy):
    """The gateway `up` started died; the kernel gave its pid to another process. `down` must
    see in /proc that it is not ours (another command line, another start time)."""
    stale = {"name": "gateway", "pid": bystander.pid,
             "argv": [sys.executable, "-m", "tracetrain.cli", "gateway"],
             "address": "127.0.0.1:8000", "health_url": None,
             "log": str(tmp_path / "gateway.log"), "started": time.time() - 3600}
    if not legacy:  # pid files now also hold the start time, ticks since this boot
        ticks = int(Path(f"/proc/{bystander.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        stale.update(start_ticks=ticks - 1000,
                     boot_id=Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    _pid_file(tmp_path, stale)
    result = subprocess.run([TRACETRAIN, "down"], env=_env(tmp_path), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "nothing of ours was running" in result.stdout
    assert bystander.poll() is None, "down killed a process it did not start"
    assert processes.records(tmp_path) == []  # the stale pid file is gone


# Starts a process through the spawner, then lives on without ever reaping it.
_NEGLECTFUL_PARENT = """
import sys, time
from pathlib import Path
from infra import processes
record = processes.spawn(Path(sys.argv[1]), "gateway", [sys.executable, "-c", "pass"],
                         address="127.0.0.1:1")
print(record.pid, flush=True)
time.sleep(300)
"""


@pytest.mark.faults
def test_down_does_not_hang_on_a_zombie(tmp_path):
    """A process `up` started exited while its parent lives on without reaping it (a demo
    blocked elsewhere). `down`, from another process, cannot reap it: it must count it as
    exited instead of waiting for it to die."""
    parent = subprocess.Popen([sys.executable, "-c", _NEGLECTFUL_PARENT, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        pid = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while _state(pid) != "Z":
            assert time.monotonic() < deadline, f"pid {pid} did not become a zombie"
            time.sleep(0.05)
        started = time.monotonic()
        result = subprocess.run([TRACETRAIN, "down"], env=_env(tmp_path), capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert time.monotonic() - started < 15  # no SIGTERM wait for a process already gone
        assert _state(pid) == "Z"  # still unreaped: down coped without reaping it
        assert processes.records(tmp_path) == []
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.faults
def test_smoke_never_stops_a_stack_it_did_not_start(tmp_path):
    """A stack already runs from this state folder (here its broker's pid file and live
    process); `smoke` fails on it with a clear error and leaves it running."""
    running = processes.spawn(tmp_path, "kafka-1", ["sleep", "300"], address="127.0.0.1:9092")
    try:
        result = subprocess.run([TRACETRAIN, "smoke"], env=_env(tmp_path), capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 2
        assert f"kafka-1 is already running (pid {running.pid})" in result.stderr
        assert "stopped nothing" in result.stdout
        assert processes.pid_alive(running.pid), "smoke stopped a broker it did not start"
        assert [r.name for r in processes.records(tmp_path)] == ["kafka-1"]
    finally:
        os.killpg(running.pid, signal.SIGKILL)
        os.waitpid(running.pid, 0)


@pytest.mark.parametrize("service, setting", [
    ("gateway", "gateway.port"), ("mlflow", "mlflow.port"), ("kafka", "kafka.port")])
def test_a_port_already_taken_names_the_port_and_the_setting(tmp_path, service, setting):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        variable = "TRACETRAIN_" + setting.upper().replace(".", "__")
        env = {**_env(tmp_path), variable: str(port)}
        result = subprocess.run([TRACETRAIN, "up", "--services", service], env=env,
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert f"port 127.0.0.1:{port} for " in result.stderr
    assert f"is already taken (setting {setting}, {variable})" in result.stderr
    assert f"set {variable} to another port" in result.stderr
    assert processes.records(tmp_path) == []  # nothing was started


def test_free_ports_lie_below_the_ephemeral_range_and_are_never_handed_out_twice():
    """An ephemeral port can be taken by any outgoing connection between the check and the
    server's bind; two servers of one test must not be given the same port."""
    floor = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    firsts = [processes.free_ports(3) for _ in range(50)] + [processes.free_port() for _ in range(50)]
    taken = [p for first in firsts[:50] for p in range(first, first + 3)] + firsts[50:]
    assert len(set(taken)) == len(taken)
    assert all(p < floor for p in taken)
