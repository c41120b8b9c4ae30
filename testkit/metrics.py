"""Checks the tests make on a process's `/metrics` and `/state` pages (tracetrain.observability):
every exported name under the scheme, the state as parsed JSON."""

from __future__ import annotations

import httpx

from tracetrain.observability import scheme_pattern


def metric_names(text: str) -> set[str]:
    """The sample names in a Prometheus text exposition."""
    return {line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines()
            if line and not line.startswith("#")}


class Samples(dict):
    """Sample values of a Prometheus page, looked up as page[name, {label: value}]."""

    def __getitem__(self, key):
        name, labels = key
        return super().__getitem__((name, tuple(sorted(labels.items()))))


def metric_samples(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, parsed by prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families

    return Samples({(s.name, tuple(sorted(s.labels.items()))): s.value
                    for family in text_string_to_metric_families(text) for s in family.samples})


def check_metrics(base_url: str, *stages: str) -> set[str]:
    """GET `base_url`/metrics; assert it is Prometheus text whose every sample is named
    `tracetrain_<stage>_<what>_<unit>` with one of `stages` (the gateway's page also holds
    its publisher's); the sample names."""
    resp = httpx.get(f"{base_url}/metrics", timeout=10, follow_redirects=True)
    assert resp.status_code == 200, f"{base_url}/metrics answered {resp.status_code}"
    assert resp.headers["content-type"].startswith("text/plain"), resp.headers["content-type"]
    names = metric_names(resp.text)
    patterns = [scheme_pattern(stage) for stage in stages]
    off = sorted(n for n in names if not any(p.match(n) for p in patterns))
    assert names and not off, \
        f"{base_url}/metrics: names outside the scheme: {off or 'none served'}"
    return names


def get_state(base_url: str) -> dict:
    """GET `base_url`/state, parsed."""
    resp = httpx.get(f"{base_url}/state", timeout=10)
    assert resp.status_code == 200, f"{base_url}/state answered {resp.status_code}: {resp.text}"
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    return resp.json()
