"""The in-process tracer, for code that calls its models and tools directly.

    tracer = Tracer(Publisher(settings, name="my-agent"), agent="solver")

    @tracer.tool
    def calc(expr: str) -> float: ...

    with tracer.rollout(task_id="t-1") as r:
        r.llm(model="m", messages=msgs, response_text=out, response_token_ids=ids, ...)
        calc("2+3")
        r.reward(1.0)

Writes: tool and LLM spans, one `agent` span per rollout (when it ends), and rewards, through
the publisher (so they share its spool and guarantees). The current rollout and parent span
live in contextvars: asyncio tasks inherit them; for threads, run the function in a copied
context (`tracer.propagate(fn)` or `contextvars.copy_context().run`). A tool called outside any
rollout runs untraced: a span needs a rollout to belong to.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
import time
from collections.abc import Callable
from contextlib import contextmanager

from producers.publisher import Publisher
from producers.records import llm_part, new_id, new_rollout_id, new_span, tool_part
from producers.rewards import emit_reward

_ROLLOUT: contextvars.ContextVar[Rollout | None] = contextvars.ContextVar("tt_rollout", default=None)
_PARENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("tt_parent", default=None)


def _json(value) -> str:
    try:
        return json.dumps(value)  # the shared default encoder: the cheap path
    except (TypeError, ValueError):
        pass
    try:
        return json.dumps(value, default=repr)  # objects json does not know
    except (TypeError, ValueError):  # circular structures
        return json.dumps(repr(value))


class Rollout:
    """One episode of an agent: its spans share rollout_id and trace_id."""

    def __init__(self, tracer: Tracer, rollout_id: str, task_id: str | None, agent: str,
                 attempt_id: str | None):
        self.tracer, self.rollout_id, self.task_id = tracer, rollout_id, task_id
        self.agent, self.attempt_id = agent, attempt_id
        self.trace_id, self.span_id = new_id(16), new_id(8)
        self.start_ns = time.time_ns()
        self.rewarded = False

    def _span(self, kind: str, start_ns: int, **kw) -> dict:
        return new_span(kind, self.rollout_id, trace_id=self.trace_id,
                        parent_id=kw.pop("parent_id", None) or _PARENT.get() or self.span_id,
                        attempt_id=self.attempt_id, task_id=self.task_id, agent_name=self.agent,
                        policy_name=self.tracer.policy_name, start_time_ns=start_ns,
                        service=self.tracer.service, **kw)

    def llm(self, *, model: str, messages=None, prompt: str | None = None,
            response_text: str = "", start_ns: int | None = None, attributes=None,
            status: str = "ok", error_message: str | None = None, **llm_fields) -> str:
        """Record one model call (token ids, logprobs, policy_version...); returns its span id."""
        sent = messages if messages is not None else prompt
        span = self._span("llm", start_ns or time.time_ns(), attributes=attributes,
                          status=status, error_message=error_message,
                          llm=llm_part(model, request_messages=_json(sent),
                                       response_text=response_text, **llm_fields))
        self.tracer.publisher.publish_span(span)
        return span["span_id"]

    def reward(self, value: float, *, final: bool = True, name: str | None = None,
               span_id: str | None = None) -> None:
        """Publish a reward; `final=True` (default) closes the rollout downstream. A value
        that is not a finite number within `settings.rewards.max_abs` raises ProducerError."""
        emit_reward(self.tracer.publisher, self.rollout_id, value, final=final, name=name,
                    span_id=span_id, task_id=self.task_id, agent_name=self.agent)
        self.rewarded = self.rewarded or final


class Tracer:
    def __init__(self, publisher: Publisher, agent: str = "", service: str = "",
                 policy_name: str | None = None):
        self.publisher, self.agent, self.service = publisher, agent, service
        self.policy_name = policy_name

    @staticmethod
    def current() -> Rollout | None:
        return _ROLLOUT.get()

    @contextmanager
    def rollout(self, task_id: str | None = None, agent: str | None = None,
                rollout_id: str | None = None, attempt_id: str | None = None):
        r = Rollout(self, rollout_id or new_rollout_id(), task_id, agent or self.agent, attempt_id)
        token = _ROLLOUT.set(r)
        ptoken = _PARENT.set(r.span_id)
        error = None
        try:
            yield r
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            _PARENT.reset(ptoken)
            _ROLLOUT.reset(token)
            self.publisher.publish_span(new_span(
                "agent", r.rollout_id, trace_id=r.trace_id, span_id=r.span_id,
                attempt_id=r.attempt_id, task_id=r.task_id, agent_name=r.agent,
                policy_name=self.policy_name, start_time_ns=r.start_ns,
                status="error" if error else "ok", error_message=error, service=self.service))

    def tool(self, fn: Callable | None = None, *, name: str | None = None):
        """Decorator: each call inside a rollout becomes a tool span (arguments, result, ok)."""
        if fn is None:
            return functools.partial(self.tool, name=name)
        tool_name = name or fn.__name__
        sig = inspect.signature(fn)
        kinds = {p.kind for p in sig.parameters.values()}
        names = [n for n, p in sig.parameters.items()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        # Signature.bind costs microseconds per call; plain signatures zip names instead.
        simple = not kinds & {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}

        def arguments(args, kwargs) -> str:
            if simple and len(args) <= len(names):
                named = dict(zip(names, args, strict=False))
                named.update(kwargs)
                return _json(named)
            try:
                return _json(dict(sig.bind(*args, **kwargs).arguments))
            except TypeError:
                return _json({"args": list(args), "kwargs": kwargs})

        def record(r: Rollout, span_id: str, parent: str | None, start: int, args, kwargs,
                   result, exc) -> None:
            self.publisher.publish_span(r._span(
                "tool", start, span_id=span_id, parent_id=parent,
                status="error" if exc else "ok",
                error_message=f"{type(exc).__name__}: {exc}" if exc else None,
                tool=tool_part(tool_name, arguments(args, kwargs),
                               None if exc else _json(result), ok=exc is None)))

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def async_wrapper(*args, **kwargs):
                r = _ROLLOUT.get()
                if r is None:
                    return await fn(*args, **kwargs)
                span_id, start, parent = new_id(8), time.time_ns(), _PARENT.get()
                token = _PARENT.set(span_id)
                try:
                    result = await fn(*args, **kwargs)
                except Exception as exc:
                    record(r, span_id, parent, start, args, kwargs, None, exc)
                    raise
                finally:
                    _PARENT.reset(token)
                record(r, span_id, parent, start, args, kwargs, result, None)
                return result
            return async_wrapper

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            r = _ROLLOUT.get()
            if r is None:
                return fn(*args, **kwargs)
            span_id, start, parent = new_id(8), time.time_ns(), _PARENT.get()
            token = _PARENT.set(span_id)
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                record(r, span_id, parent, start, args, kwargs, None, exc)
                raise
            finally:
                _PARENT.reset(token)
            record(r, span_id, parent, start, args, kwargs, result, None)
            return result
        return wrapper

    @staticmethod
    def propagate(fn: Callable) -> Callable:
        """`fn` bound to the current context, for a thread pool: pool.submit(propagate(f), x)."""
        ctx = contextvars.copy_context()
        return functools.partial(ctx.run, fn)
