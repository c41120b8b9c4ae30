"""Added latency and throughput of the gateway in front of a fixed-response upstream, versus
calling that upstream directly, in the same run.

    .venv/bin/python -m bench.gateway [--requests 300] [--concurrency 8]

Starts its own Kafka broker, the fixed upstream (`python -m testkit.fixed_upstream`)
and the gateway as a detached stack service (`tracetrain gateway`), each its own process.
Latency: sequential non-streamed chat calls alternating direct / through the gateway; added
p50 and p99 are the differences of the percentiles; the gateway's own CPU time per call is
read from /proc (on a loaded machine the added latency also holds scheduling waits). rps: `--concurrency` client threads
through the gateway. Prints one JSON line last: rps, added_p50_ms, added_p99_ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from bench.producer import temp_broker, with_topics
from infra import processes, services
from producers.service import GATEWAY

BODY = {"model": "fixed-model", "messages": [{"role": "user", "content": "Say hello"}]}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (and its reaped children), from /proc."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    with temp_broker() as base:
        settings = with_topics(base)
        home = settings.home_dir
        up_port = processes.free_port()
        upstream = processes.spawn(home, "fixed-upstream", [
            sys.executable, "-m", "testkit.fixed_upstream", str(up_port)],
            address=f"127.0.0.1:{up_port}")
        try:
            processes.wait_until(lambda: processes.port_in_use("127.0.0.1", up_port), 30,
                                 "fixed upstream", log=upstream.log)
            gw = settings.gateway.model_copy(update={
                "port": processes.free_port(), "upstream_url": f"http://127.0.0.1:{up_port}/v1"})
            gateway = services.start(settings.model_copy(update={"gateway": gw}), GATEWAY)
            direct_url = f"http://127.0.0.1:{up_port}/v1/chat/completions"
            gw_url = f"http://127.0.0.1:{gw.port}/v1/chat/completions"
            direct, via = [], []
            with httpx.Client(timeout=30) as client:
                for _ in range(20):  # warm-up: connections, first span publish
                    client.post(direct_url, json=BODY)
                    client.post(gw_url, json=BODY)
                cpu0 = cpu_seconds(gateway.pid)
                for _ in range(args.requests):
                    for url, out in ((direct_url, direct), (gw_url, via)):
                        t0 = time.perf_counter()
                        resp = client.post(url, json=BODY)
                        out.append((time.perf_counter() - t0) * 1000)
                        resp.raise_for_status()

                cpu_ms = (cpu_seconds(gateway.pid) - cpu0) * 1000 / args.requests

                def one(_):
                    client.post(gw_url, json=BODY).raise_for_status()

                t0 = time.perf_counter()
                with ThreadPoolExecutor(args.concurrency) as pool:
                    list(pool.map(one, range(args.requests)))
                rps = args.requests / (time.perf_counter() - t0)
                health = client.get(f"http://127.0.0.1:{gw.port}/healthz").json()
        finally:
            processes.stop(home, "gateway")
            processes.stop(home, "fixed-upstream")
    result = {
        "rps": round(rps, 1),
        "added_p50_ms": round(statistics.median(via) - statistics.median(direct), 2),
        "added_p99_ms": round(pct(via, 0.99) - pct(direct, 0.99), 2),
        "direct_p50_ms": round(statistics.median(direct), 2),
        "gateway_p50_ms": round(statistics.median(via), 2),
        "gateway_cpu_ms_per_call": round(cpu_ms, 2),
        "requests": args.requests, "concurrency": args.concurrency,
        "spans_sent": health["counts"]["sent"],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
