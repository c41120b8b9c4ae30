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

from dataclasses import dataclass, field

from examples.calc.calculator import evaluate, format_number
from examples.calc.problems import Problem
from examples.calc.reward import reward
from examples.errors import ExamplesError
from examples.prompts import load_prompt
from examples.tool_loop import RESULT, ToolLoopAgent

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


@dataclass
class Episode:
    problem: Problem
    rollout_id: str
    transcript: list[dict] = field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    reward: float = 0.0
    final_text: str = ""


class CalcAgent(ToolLoopAgent):
    TOOL, AGENT, REWARD_NAME = "calc", "calc", "exact_answer"

    def __init__(self, base_url: str, tracer=None, system_prompt: str | None = None,
                 prompt_uri: str | None = None, **options):
        """`system_prompt` replaces SYSTEM_PROMPT; `prompt_uri` (prompts:/NAME@ALIAS, with
        MLflow's tracking URI set) fetches it from the prompt registry once, here."""
        if system_prompt is not None and prompt_uri is not None:
            raise ExamplesError("give system_prompt or prompt_uri, not both")
        if prompt_uri is not None:
            system_prompt = load_prompt(prompt_uri)
        self.system_prompt = SYSTEM_PROMPT if system_prompt is None else system_prompt
        super().__init__(base_url, tracer, **options)
        self._calc = self.traced(self._run_calculator)

    @staticmethod
    def _run_calculator(expression: str) -> str:
        return format_number(evaluate(expression))

    def opening(self, problem: Problem) -> list[dict]:
        """The messages of the first call: the prompt, the worked exchange, the problem."""
        return [{"role": "system", "content": self.system_prompt}, *DEMONSTRATION,
                {"role": "user", "content": problem.question}]

    def worked(self, problem: Problem) -> list[dict]:
        """The problem solved as the agent should: one demonstration per call, in TRL's
        conversational prompt-completion form (the learner's warm start, learner/warm_start.py)
        over exactly the messages this agent sends: the expression the problem was made from,
        then the answer after its result."""
        call = f"<tool>calc: {problem.expression}</tool>"
        first = self.opening(problem)
        second = [*first, {"role": "assistant", "content": call},
                  {"role": "user", "content": RESULT + self._run_calculator(problem.expression)}]
        return [{"prompt": first, "completion": [{"role": "assistant", "content": call}]},
                {"prompt": second, "completion": [{"role": "assistant",
                                                   "content": f"ANSWER: {problem.answer}"}]}]

    def solve(self, problem: Problem, task_id: str | None = None, seed: int | None = None) -> Episode:
        task_id = task_id or f"calc-{abs(hash(problem.question)) % 10**10}"
        with self.rollout(task_id) as (rollout_id, publish):
            episode = Episode(problem, rollout_id)
            episode.transcript = self.opening(problem)
            episode.final_text, episode.tool_calls, episode.tool_errors = self.loop(
                episode.transcript, task_id, rollout_id, seed, self._calc)
            episode.reward = reward(episode.final_text, problem.answer)
            publish(episode.reward)
        return episode
