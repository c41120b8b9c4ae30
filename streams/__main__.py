"""`python -m streams [--max-seconds N]`: one Faust worker of the rollout join, with the
settings of the environment (`TRACETRAIN_*`). See streams/app.py."""

from __future__ import annotations

import argparse

from streams.app import run_worker
from tracetrain.settings import load_settings


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m streams", description=__doc__)
    parser.add_argument("--max-seconds", type=float, default=None, help="Stop after this long.")
    parser.add_argument("--loglevel", default="WARNING")
    args = parser.parse_args()
    run_worker(load_settings(), args.max_seconds, args.loglevel)


if __name__ == "__main__":
    main()
