"""Keeps one stage process running: the supervisor `tracetrain up` puts in front of a service
declared with `restart=True` (the streams worker).

    python -m infra.supervise --name streams -- python -m tracetrain.cli streams

Runs the command as its child and starts it again whenever it ends other than by a stop: a
non-zero exit status (the streams worker exits 70 when Kafka failed a record it wrote, rather
than commit past it) or a signal. The wait before a restart doubles from 1 s up to 60 s while
the child keeps dying young, and is back to 1 s after it ran `STABLE_S`. A child that exits 0
(a bounded run that finished) ends the supervision. SIGTERM or SIGINT (`tracetrain down`
signals the whole process group) is passed to the child and ends the supervision once the child
exits; the child is killed if the supervisor itself dies (Linux's parent-death signal), so a
kill -9 of the service still kills the service.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import signal
import subprocess
import sys
import time

log = logging.getLogger("tracetrain.supervise")

FIRST_WAIT_S, LONGEST_WAIT_S = 1.0, 60.0
STABLE_S = 300.0  # a child that ran this long was healthy: the next restart waits FIRST_WAIT_S
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: receive SIGKILL when the supervisor dies."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def supervise(name: str, argv: list[str]) -> int:
    stopping = False
    child: subprocess.Popen | None = None

    def stop(signum, _frame) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    wait_s = FIRST_WAIT_S
    while True:
        started = time.monotonic()
        child = subprocess.Popen(argv, preexec_fn=_die_with_parent)
        code = child.wait()
        if stopping or code == 0:
            return code
        ran_s = time.monotonic() - started
        wait_s = FIRST_WAIT_S if ran_s >= STABLE_S else wait_s
        log.error("%s (pid %d) ended with %s after %.0f s; starting it again in %.0f s",
                  name, child.pid, f"status {code}" if code > 0 else f"signal {-code}", ran_s,
                  wait_s)
        deadline = time.monotonic() + wait_s
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.1)
        if stopping:
            return code
        wait_s = min(wait_s * 2, LONGEST_WAIT_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="What the log lines call the child.")
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- then the child's command.")
    args = parser.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        parser.error("expected the child's command after --")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    sys.exit(supervise(args.name, argv))


if __name__ == "__main__":
    main()
