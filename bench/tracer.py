"""Added cost of the in-process tracer on the caller's thread, per span.

    .venv/bin/python -m bench.tracer [--calls 20000]

Starts its own Kafka broker; inside one rollout, calls a trivial function plain and wrapped
by `@tracer.tool` alternately, and takes the difference of each pair (so machine noise hits
both sides). The traced call builds the span, encodes it, appends it to the spool and hands it
to librdkafka: all of it on the caller's thread. Prints one JSON line last: median_us, p99_us.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bench.producer import temp_broker, with_topics
from producers.publisher import Publisher
from producers.tracer import Tracer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    with temp_broker() as base:
        settings = with_topics(base)
        pub = Publisher(settings, name="bench-tracer", spool_dir=base.home_dir / "spool")
        tracer = Tracer(pub, agent="bench")

        def plain(expr: str, depth: int = 1) -> int:
            return len(expr) * depth

        traced = tracer.tool(plain)
        added: list[int] = []
        clock = time.perf_counter_ns
        with tracer.rollout(task_id="bench") as _r:
            for i in range(args.calls + 1000):
                t0 = clock()
                plain("2+3", depth=i)
                t1 = clock()
                traced("2+3", depth=i)
                t2 = clock()
                if i >= 1000:  # the first calls warm caches and connections
                    added.append((t2 - t1) - (t1 - t0))
        left = pub.close(60)
    added.sort()
    result = {
        "median_us": round(statistics.median(added) / 1000, 2),
        "p99_us": round(added[int(len(added) * 0.99)] / 1000, 2),
        "mean_us": round(statistics.fmean(added) / 1000, 2),
        "calls": len(added), "undelivered": left,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
