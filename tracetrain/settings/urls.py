"""The engine addresses a section lists (the gateway's upstreams, the reloader's engines): each
an http(s) URL with a host, none twice, every bad one named in the one error."""

from __future__ import annotations

from urllib.parse import urlsplit


def _problem(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a port that is not a number in range)
    except ValueError as exc:
        return str(exc)
    if parts.scheme not in ("http", "https"):
        return f"scheme {parts.scheme or 'none'!r} is not http or https"
    if not parts.hostname:
        return "no host"
    if parts.query or parts.fragment:
        return "a query or fragment has no place in a base URL"
    return None


def check_urls(urls: list[str], example: str) -> list[str]:
    """`urls` without trailing slashes; ValueError naming each bad or repeated URL (a repeated
    one would count one engine twice: twice the share of new rollouts)."""
    problems, seen = [], set()
    for index, url in enumerate(urls):
        why = _problem(url)
        if why is not None:
            problems.append(f"[{index}] {url!r}: {why}")
        elif url.rstrip("/") in seen:
            problems.append(f"[{index}] {url!r}: listed twice")
        seen.add(url.rstrip("/"))
    if problems:
        raise ValueError(f"{'; '.join(problems)}; expected http(s) URLs such as {example!r}")
    return [url.rstrip("/") for url in urls]
