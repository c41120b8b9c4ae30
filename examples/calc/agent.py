"""The calc agent: a plain `openai` client pointed at the gateway, with a calculator tool.

    agent = CalcAgent(base_url="http://127.0.0.1:8000/v1", tracer=tracer)
    result = agent.solve(problem)        # one rollout: LLM calls, tool calls, final reward

The policy may write `<tool>calc: EXPRESSION</tool>`; the agent runs the calculator and sends
the result back as the next user turn; it must end with `ANSWER: <number>`. The gateway
records each LLM call as a span of the rollout (the rollout id travels in `X-Rollout-Id`);
the tracer records each calculator call as a tool span (ok, or the CalculatorError a malformed
call raised, which the AIR deriver credits) and publishes the final reward, closing the rollout.
Nothing about the agent is tracetrain-specific but the base URL and one header.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import openai

from examples.calc.calculator import CalculatorError, evaluate, format_number
from examples.calc.problems import Problem
from examples.calc.reward import reward

SYSTEM_PROMPT = (
    "You solve arithmetic problems exactly. To compute, write one line "
    "<tool>calc: EXPRESSION</tool> (EXPRESSION uses numbers, + - * / and parentheses) and "
    "stop; the result comes back to you. When you know the result, write ANSWER: <number>."
)
# One worked exchange before the problem: SmolLM2-135M ignores the instructions alone (0% on
# held-out problems, measured) but copies a demonstrated format (about 19% greedy).
DEMONSTRATION = [
    {"role": "user", "content": "Ben has 17 coins and gets 25 more. How many coins does Ben have now?"},
    {"role": "assistant", "content": "<tool>calc: 17 + 25</tool>"},
    {"role": "user", "content": "Result: 42"},
    {"role": "assistant", "content": "ANSWER: 42"},
]
_TOOL_RE = re.compile(r"<tool>\s*calc\s*:\s*(.*?)\s*</tool>", re.IGNORECASE | re.DOTALL)


@dataclass
class Episode:
    problem: Problem
    rollout_id: str
    transcript: list[dict] = field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    reward: float = 0.0
    final_text: str = ""


class CalcAgent:
    def __init__(self, base_url: str, tracer=None, model: str = "policy", max_turns: int = 3,
                 max_tokens: int = 48, temperature: float = 1.0, api_key: str = "none",
                 agent_name: str = "calc"):
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=2, timeout=120.0)
        self.tracer, self.model, self.max_turns = tracer, model, max_turns
        self.max_tokens, self.temperature, self.agent_name = max_tokens, temperature, agent_name
        self._calc = tracer.tool(name="calc")(self._run_calculator) if tracer else self._run_calculator

    @staticmethod
    def _run_calculator(expression: str) -> str:
        return format_number(evaluate(expression))

    def solve(self, problem: Problem, task_id: str | None = None, seed: int | None = None) -> Episode:
        task_id = task_id or f"calc-{abs(hash(problem.question)) % 10**10}"
        if self.tracer is None:
            return self._episode(problem, task_id, f"untraced-{task_id}", seed, None)
        with self.tracer.rollout(task_id=task_id, agent=self.agent_name) as rollout:
            episode = self._episode(problem, task_id, rollout.rollout_id, seed, rollout)
            rollout.reward(episode.reward, final=True, name="exact_answer")
        return episode

    def _episode(self, problem, task_id, rollout_id, seed, rollout) -> Episode:
        episode = Episode(problem, rollout_id)
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, *DEMONSTRATION,
                    {"role": "user", "content": problem.question}]
        headers = {"X-Rollout-Id": rollout_id, "X-Task-Id": task_id,
                   "X-Agent-Name": self.agent_name}
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
            episode.final_text = text
            call = _TOOL_RE.search(text)
            if call is None or "ANSWER:" in text.upper():
                break
            episode.tool_calls += 1
            try:
                result = f"Result: {self._calc(call.group(1))}"
            except CalculatorError as exc:
                episode.tool_errors += 1
                result = f"Error: {exc}"
            messages.append({"role": "user", "content": result})
        episode.transcript = messages
        episode.reward = reward(episode.final_text, problem.answer)
        return episode
