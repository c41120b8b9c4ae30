"""The one-line tool loop the plain example agents share (calc's calculator, rag's search).

    class MyAgent(ToolLoopAgent):
        TOOL = "search"                   # the policy writes <tool>search: ARGUMENT</tool>
        def run_tool(self, argument): ...  # its result, or raise ExamplesError (a failed call)

Each turn is one line: a `<tool>NAME: ARGUMENT</tool>` call, whose result (or error) comes
back as the next user turn, or the final answer, which ends the episode. The client is a plain
`openai` client; the gateway records each LLM call as a span of the rollout (its id travels in
`X-Rollout-Id`), the tracer records each tool call as a tool span (ok, or the ExamplesError
the call raised, which the AIR deriver credits to the LLM call that issued it: streams/air_rules.py)
and `rollout()` publishes the final reward, closing the rollout.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import contextmanager

import openai

from examples.errors import ExamplesError

RESULT = "Result: "  # what precedes a tool's result in the user turn that returns it


class ToolLoopAgent:
    TOOL = ""          # the tool's name in `<tool>NAME: ...</tool>` and in its spans
    AGENT = ""         # the default agent name (spans' agent_name, the streams' selection)
    REWARD_NAME = ""   # the final reward's name

    def __init__(self, base_url: str, tracer=None, model: str = "policy", max_turns: int = 3,
                 max_tokens: int = 48, temperature: float = 1.0, api_key: str = "none",
                 agent_name: str | None = None):
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=2, timeout=120.0)
        self.tracer, self.model, self.max_turns = tracer, model, max_turns
        self.max_tokens, self.temperature = max_tokens, temperature
        self.agent_name = agent_name or self.AGENT
        self._tool_re = re.compile(rf"<tool>\s*{self.TOOL}\s*:\s*(.*?)\s*</tool>",
                                   re.IGNORECASE | re.DOTALL)

    def traced(self, fn: Callable) -> Callable:
        """`fn` as a tool span of the current rollout (untraced without a tracer)."""
        return self.tracer.tool(name=self.TOOL)(fn) if self.tracer else fn

    @contextmanager
    def rollout(self, task_id: str):
        """Yields the rollout id; the caller sets `.reward` on the episode it yields back
        through `publish(episode)`. Without a tracer the rollout id is `untraced-<task_id>`."""
        if self.tracer is None:
            yield f"untraced-{task_id}", lambda value: None
            return
        with self.tracer.rollout(task_id=task_id, agent=self.agent_name) as rollout:
            yield rollout.rollout_id, lambda value: rollout.reward(
                value, final=True, name=self.REWARD_NAME)

    def loop(self, messages: list[dict], task_id: str, rollout_id: str, seed: int | None,
             call_tool: Callable[[str], str]) -> tuple[str, int, int]:
        """Runs the turns on `messages` (appended in place); returns (final text, tool calls,
        failed tool calls). A failed call is an ExamplesError, fed back as `Error: ...`."""
        headers = {"X-Rollout-Id": rollout_id, "X-Task-Id": task_id,
                   "X-Agent-Name": self.agent_name}
        final, calls, errors = "", 0, 0
        for turn in range(self.max_turns):
            completion = self.client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=self.max_tokens,
                temperature=self.temperature, seed=None if seed is None else seed + turn,
                # one line per turn, as demonstrated: a rambling answer costs no more tokens
                stop=["</tool>", "\n"], extra_headers=headers,
            )
            text = completion.choices[0].message.content or ""
            if completion.choices[0].finish_reason == "stop" and "<tool>" in text and "</tool>" not in text:
                text += "</tool>"  # the stop sequence is not returned
            messages.append({"role": "assistant", "content": text})
            final = text
            call = self._tool_re.search(text)
            if call is None or "ANSWER:" in text.upper():
                break
            calls += 1
            try:
                result = f"{RESULT}{call_tool(call.group(1))}"
            except ExamplesError as exc:
                errors += 1
                result = f"Error: {exc}"
            messages.append({"role": "user", "content": result})
        return final, calls, errors
