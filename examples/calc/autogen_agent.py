"""The calc task's second front end: an AutoGen AgentChat `AssistantAgent` with the calculator
as a function tool (as in the Agent Lightning paper's Calc-X), through the same gateway.

    pip install 'tracetrain[autogen]'
    agent = AutoGenCalcAgent(base_url="http://127.0.0.1:8000/v1", tracer=tracer)
    episode = agent.solve(problem)       # same Episode and reward as examples/calc/agent.py

The model sees the calculator as an OpenAI `tools` entry and calls it with `tool_calls` (the
engine renders them in the model's chat template and parses them back); AutoGen runs the tool
and asks the model again until it answers in text (`max_turns` tool rounds at most). Only the
AutoGen client's base URL and headers point it at tracetrain: the gateway records each model
call of the rollout, the tracer the calculator calls (a malformed expression is a failed tool
span, which AutoGen hands back to the model as an error) and the final reward.
"""

from __future__ import annotations

import asyncio

from examples.calc.agent import Episode
from examples.calc.calculator import evaluate, format_number
from examples.calc.problems import Problem
from examples.calc.reward import reward

SYSTEM_PROMPT = (
    "You solve arithmetic problems exactly. Use the calc tool to compute; when you know the "
    "result, write ANSWER: <number>."
)


def demonstration() -> list:
    """One worked exchange, as the plain agent has (examples/calc/agent.py: SmolLM2-135M
    ignores instructions alone but copies a demonstrated format), here with a real tool call."""
    from autogen_core import FunctionCall
    from autogen_core.models import (
        AssistantMessage,
        FunctionExecutionResult,
        FunctionExecutionResultMessage,
        UserMessage,
    )

    call = FunctionCall(id="call_demo", name="calc", arguments='{"expression": "17 + 25"}')
    return [
        UserMessage(content="Ben has 17 coins and gets 25 more. How many coins does Ben have now?",
                    source="user"),
        AssistantMessage(content=[call], source="calc"),
        FunctionExecutionResultMessage(content=[FunctionExecutionResult(
            content="42", name="calc", call_id="call_demo", is_error=False)]),
        AssistantMessage(content="ANSWER: 42", source="calc"),
    ]


def calc(expression: str) -> str:
    """Evaluate an arithmetic expression (numbers, + - * / and parentheses) exactly."""
    return format_number(evaluate(expression))


class AutoGenCalcAgent:
    def __init__(self, base_url: str, tracer=None, model: str = "policy", max_turns: int = 3,
                 max_tokens: int = 64, temperature: float = 1.0, api_key: str = "none",
                 agent_name: str = "calc-autogen"):
        try:
            import autogen_agentchat  # noqa: F401
            import autogen_ext.models.openai  # noqa: F401
        except ImportError as exc:
            raise ImportError("the AutoGen front end needs the autogen extra: "
                              "pip install 'tracetrain[autogen]'") from exc
        self.base_url, self.tracer, self.model, self.max_turns = base_url, tracer, model, max_turns
        self.max_tokens, self.temperature, self.api_key = max_tokens, temperature, api_key
        self.agent_name = agent_name

        # Async, so AutoGen runs it on the rollout's own task (its context holds the rollout)
        # instead of a thread-pool thread that would not see it.
        async def calc_tool(expression: str) -> str:
            return calc(expression)

        calc_tool.__doc__ = calc.__doc__
        calc_tool.__name__ = "calc"
        self._calc = tracer.tool(name="calc")(calc_tool) if tracer else calc_tool

    def solve(self, problem: Problem, task_id: str | None = None, seed: int | None = None) -> Episode:
        task_id = task_id or f"calc-{abs(hash(problem.question)) % 10**10}"
        if self.tracer is None:
            return asyncio.run(self._episode(problem, task_id, f"untraced-{task_id}", seed))
        with self.tracer.rollout(task_id=task_id, agent=self.agent_name) as rollout:
            # asyncio.run copies this context into its task: the tool spans find the rollout.
            episode = asyncio.run(self._episode(problem, task_id, rollout.rollout_id, seed))
            rollout.reward(episode.reward, final=True, name="exact_answer")
        return episode

    async def _episode(self, problem: Problem, task_id: str, rollout_id: str,
                       seed: int | None) -> Episode:
        from autogen_agentchat.agents import AssistantAgent
        from autogen_agentchat.messages import TextMessage, ToolCallExecutionEvent
        from autogen_core.model_context import UnboundedChatCompletionContext
        from autogen_core.models import ModelFamily, ModelInfo
        from autogen_ext.models.openai import OpenAIChatCompletionClient

        client = OpenAIChatCompletionClient(
            model=self.model, base_url=self.base_url, api_key=self.api_key,
            model_info=ModelInfo(vision=False, function_calling=True, json_output=False,
                                 structured_output=False, family=ModelFamily.UNKNOWN),
            temperature=self.temperature, max_tokens=self.max_tokens, seed=seed,
            default_headers={"X-Rollout-Id": rollout_id, "X-Task-Id": task_id,
                             "X-Agent-Name": self.agent_name},
        )
        agent = AssistantAgent(self.agent_name.replace("-", "_"), model_client=client,
                               tools=[self._calc], system_message=SYSTEM_PROMPT,
                               reflect_on_tool_use=True, max_tool_iterations=self.max_turns,
                               model_context=UnboundedChatCompletionContext(demonstration()))
        episode = Episode(problem, rollout_id)
        try:
            result = await agent.run(task=problem.question)
        finally:
            await client.close()
        for message in result.messages:
            if isinstance(message, ToolCallExecutionEvent):
                episode.tool_calls += len(message.content)
                episode.tool_errors += sum(r.is_error for r in message.content)
            episode.transcript.append({"type": type(message).__name__,
                                       "content": str(message.content)})
        texts = [m.content for m in result.messages if isinstance(m, TextMessage)
                 and m.source != "user"]
        episode.final_text = texts[-1] if texts else ""
        episode.reward = reward(episode.final_text, problem.answer)
        return episode
