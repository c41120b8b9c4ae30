"""Who a call belongs to: rollout, attempt, task and agent ids from the request, and the
rollout's mode.

Sources, first match wins: the path prefix `/rollouts/{rollout_id}/v1/...` (for clients that
cannot set headers), then `X-Rollout-Id`, `X-Attempt-Id`, `X-Task-Id`, `X-Agent-Name`,
`X-Policy-Name`, `X-Parent-Span-Id`; a call without a rollout id gets a generated one, which
the gateway returns in the `X-Rollout-Id` response header. The mode (`train` or `val`) comes
from the path prefix `/rollouts/{rollout_id}/{mode}/v1/...`, then `X-Rollout-Mode`; none is
production traffic, forwarded as sent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from producers.records import new_id, new_rollout_id
from tracetrain.errors import BadRequest
from tracetrain.modes import ROLLOUT_MODES, one_of

# Ids travel as Kafka keys and into file names downstream: keep them plain and bounded.
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")
HEADERS = {"rollout_id": "x-rollout-id", "attempt_id": "x-attempt-id", "task_id": "x-task-id",
           "agent_name": "x-agent-name", "policy_name": "x-policy-name",
           "parent_id": "x-parent-span-id", "trace_id": "x-trace-id"}
MODE_HEADER = "x-rollout-mode"


class BadIdHeader(BadRequest):
    """An id header (or path segment) that does not look like an id; becomes a 400."""


@dataclass
class CallIds:
    rollout_id: str
    generated: bool
    trace_id: str
    attempt_id: str | None = None
    task_id: str | None = None
    agent_name: str = ""
    policy_name: str | None = None
    parent_id: str | None = None
    mode: str | None = None  # tracetrain.modes.RolloutMode, or None (production traffic)


def _checked(name: str, value) -> str:
    if not isinstance(value, str) or not ID_PATTERN.match(value):
        shown = value if not isinstance(value, str) or len(value) <= 40 else value[:40] + "..."
        raise BadIdHeader(f"{name} {shown!r} is not a valid id: expected 1-128 characters of "
                          "[A-Za-z0-9._:@-], starting with a letter or digit")
    return value


# The id fields of a Span that become Kafka keys, join keys or file names downstream; the
# optional ones may be None (agent_name: empty).
SPAN_IDS = ("rollout_id", "trace_id", "span_id")
OPTIONAL_SPAN_IDS = ("parent_id", "attempt_id", "task_id", "policy_name", "agent_name")


def check_span_ids(span: dict, where: str) -> None:
    """BadIdHeader naming the first id of `span` that is not an id, as the headers are checked
    (a 64 KB rollout id would otherwise reach the spool and Kafka)."""
    for field in SPAN_IDS:
        _checked(f"{where} {field}", span.get(field))
    for field in OPTIONAL_SPAN_IDS:
        if span.get(field) not in (None, ""):
            _checked(f"{where} {field}", span[field])


def rollout_mode(headers, path_mode: str | None) -> str | None:
    """The call's mode from the path segment or `X-Rollout-Mode`; a 400 naming an unknown one."""
    value, where = (path_mode, "path rollout mode") if path_mode is not None else \
        (headers.get(MODE_HEADER), "X-Rollout-Mode")
    if value is None:
        return None
    mode = value.strip().lower()
    if mode not in ROLLOUT_MODES:
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise BadIdHeader(f"{where} {shown!r} is not a rollout mode: expected "
                          f"{one_of(ROLLOUT_MODES)}")
    return mode


def call_ids(headers, path_rollout_id: str | None, path_mode: str | None = None) -> CallIds:
    found: dict[str, str | None] = {}
    for field, header in HEADERS.items():
        value = headers.get(header)
        found[field] = _checked(header.title(), value.strip()) if value is not None else None
    rollout = found.pop("rollout_id")
    if path_rollout_id is not None:
        rollout = _checked("path rollout id", path_rollout_id)
    generated = rollout is None
    return CallIds(
        rollout_id=rollout or new_rollout_id(), generated=generated,
        trace_id=found.pop("trace_id") or new_id(16),
        agent_name=found.pop("agent_name") or "", mode=rollout_mode(headers, path_mode),
        **found,
    )
