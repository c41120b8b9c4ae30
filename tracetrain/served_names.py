"""How a policy version travels in a served model name, for engines that report none (vLLM):
the reloader loads each LoRA version also as `<name>-v<policy_version>`, the gateway sends a
call for `<name>` to the newest such name the engine lists, and the answer's `model` says which
version produced it (`policy-v12` -> 12)."""

from __future__ import annotations

import re

_VERSIONED = re.compile(r"^(?P<name>.+)-v(?P<version>\d{1,18})$")


def versioned(name: str, policy_version: int) -> str:
    return f"{name}-v{policy_version}"


def parse(served: str) -> tuple[str, int] | None:
    """(name, policy version) of a versioned name; None for any other name."""
    match = _VERSIONED.match(served)
    return (match["name"], int(match["version"])) if match else None


def version_of(requested: str, served: str) -> int | None:
    """The policy version of `served` when it is the versioned name of `requested`."""
    parsed = parse(served)
    return parsed[1] if parsed is not None and parsed[0] == requested else None
