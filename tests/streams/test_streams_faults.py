"""Kill -9 a worker mid-workload: after a restart (or with a second worker taking over its
partitions) every expected transition arrives, duplicates only with identical ids and content."""

from __future__ import annotations

import os
import signal
import time

import pytest
from test_streams_worker import check, read_transitions, worker_report

from testkit.streams import consume, produce
from testkit.workload import generate, interleave, reference

pytestmark = [pytest.mark.integration, pytest.mark.faults]

# A dead member's partitions move once its session expires; short, so that the tests do not
# wait Faust's default, long enough that a worker on a loaded machine keeps its heartbeat.
SESSION_S = 10.0


def fault_settings(streams_settings):
    return streams_settings.model_copy(update={"streams": streams_settings.streams.model_copy(
        update={"session_timeout_s": SESSION_S})})


def kill9_when_some_transitions_out(settings, record, want) -> int:
    """Wait until a quarter of the transitions are out, then SIGKILL the worker."""
    seen = consume(settings, "transitions", lambda r: len(r) >= len(want) // 4, timeout_s=120)
    assert len(want) // 4 <= len(seen) < len(want), "the worker was not killed mid-workload"
    os.kill(record.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.waitpid(record.pid, os.WNOHANG)
            os.kill(record.pid, 0)
        except (ChildProcessError, ProcessLookupError):
            break
        time.sleep(0.05)
    return len(seen)


def test_kill9_and_restart(streams_settings, workers):
    settings = fault_settings(streams_settings)
    first = workers(settings)
    rollouts = generate(600, seed=21, p_never_closed=0.0)
    want = reference(rollouts, settings.streams)
    produce(settings, interleave(rollouts, seed=21))
    kill9_when_some_transitions_out(settings, first, want)
    second = workers(settings)  # same group: recovers the table from its changelog
    check(read_transitions(settings, want, timeout_s=180), want, allow_duplicates=True,
          report=lambda: worker_report(settings, [second]))


def test_two_workers_kill_one(streams_settings, workers):
    settings = fault_settings(streams_settings)
    doomed = workers(settings)
    survivor = workers(settings)
    rollouts = generate(600, seed=22, p_never_closed=0.0)
    want = reference(rollouts, settings.streams)
    time.sleep(3)  # let the group settle with both members
    produce(settings, interleave(rollouts, seed=22))
    kill9_when_some_transitions_out(settings, doomed, want)
    check(read_transitions(settings, want, timeout_s=180), want, allow_duplicates=True,
          report=lambda: worker_report(settings, [survivor]))
