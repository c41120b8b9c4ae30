"""The calc agent: a plain `openai` client pointed at the gateway, with a calculator tool.

    agent = CalcAgent(base_url="http://127.0.0.1:8000/v1", tracer=tracer)
    result = agent.solve(problem)        # one rollout: LLM calls, tool calls, final reward

The policy may write `<tool>calc: EXPRESSION</tool>`; the agent runs the calculator and sends
the result back as the next user turn; it must end with `ANSWER: <number>`. Two styles of
solving, each a prompt, a worked exchange in it and the demonstrations `worked` writes:
`expression` (the default) writes the whole problem as one expression (`17 + 25 - 9`);
`steps` computes one operation a call, each on the result before it (`17 + 25`, then
`42 - 9`). The calculator takes either in both. The gateway
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
# The idea of steps: a 135M model writing a three-operation story as one expression must order
# the operations and place the parentheses at once, and fails most of those (0.20 held-out,
# against 0.79 of one-operation problems, run 17); one operation a call, on the result before
# it, asks only which number and which operation come next. It did not help (below).
STEPS_PROMPT = (
    "You solve arithmetic problems exactly, one operation at a time. Write one line "
    "<tool>calc: A OP B</tool> (two numbers, OP one of + - * /) and stop; the result comes "
    "back to you. Go on from the result with the next operation. When the problem is solved, "
    "write ANSWER: <number>."
)
STEPS_DEMONSTRATION = [
    {"role": "user", "content": "Ben has 17 coins and gets 25 more. He spends 9 coins on a "
                                "drink. How many coins does Ben have now?"},
    {"role": "assistant", "content": "<tool>calc: 17 + 25</tool>"},
    {"role": "user", "content": "Result: 42"},
    {"role": "assistant", "content": "<tool>calc: 42 - 9</tool>"},
    {"role": "user", "content": "Result: 33"},
    {"role": "assistant", "content": "ANSWER: 33"},
]
STYLES = {"steps": (STEPS_PROMPT, STEPS_DEMONSTRATION), "expression": (SYSTEM_PROMPT, DEMONSTRATION)}
# Measured (README, the demo: run 19 against runs 16-17): steps scored the same held-out
# accuracy (0.47) in 29 minutes where expression took 22, so expression stays.
DEFAULT_STYLE = "expression"
# calls a rollout may make: a problem's operations (at most 3) and the answer, and one more
MAX_TURNS = {"steps": 5, "expression": 3}


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
                 prompt_uri: str | None = None, style: str = DEFAULT_STYLE, **options):
        """`style`: `steps` or `expression` (the module's docstring); `system_prompt` replaces
        the style's prompt; `prompt_uri` (prompts:/NAME@ALIAS, with MLflow's tracking URI set)
        fetches it from the prompt registry once, here."""
        if style not in STYLES:
            raise ExamplesError(f"calc style {style!r}: expected one of {', '.join(STYLES)}")
        if system_prompt is not None and prompt_uri is not None:
            raise ExamplesError("give system_prompt or prompt_uri, not both")
        if prompt_uri is not None:
            system_prompt = load_prompt(prompt_uri)
        self.style = style
        prompt, self.demonstration = STYLES[style]
        self.system_prompt = prompt if system_prompt is None else system_prompt
        options.setdefault("max_turns", MAX_TURNS[style])
        super().__init__(base_url, tracer, **options)
        self._calc = self.traced(self._run_calculator)

    @staticmethod
    def _run_calculator(expression: str) -> str:
        return format_number(evaluate(expression))

    def opening(self, problem: Problem) -> list[dict]:
        """The messages of the first call: the prompt, the worked exchange, the problem."""
        return [{"role": "system", "content": self.system_prompt}, *self.demonstration,
                {"role": "user", "content": problem.question}]

    def worked(self, problem: Problem) -> list[dict]:
        """The problem solved as the agent should: one demonstration per call, in TRL's
        conversational prompt-completion form (the learner's warm start, learner/warm_start.py)
        over exactly the messages this agent sends: the expression the problem was made from
        (`expression`) or its operations one by one (`steps`), then the answer after the last
        result."""
        calls = steps(problem.expression) if self.style == "steps" else [problem.expression]
        demonstrations, messages = [], self.opening(problem)
        for expression in [*calls, None]:
            text = f"ANSWER: {problem.answer}" if expression is None else \
                f"<tool>calc: {expression}</tool>"
            demonstrations.append({"prompt": list(messages),
                                   "completion": [{"role": "assistant", "content": text}]})
            if expression is not None:
                messages += [{"role": "assistant", "content": text},
                             {"role": "user", "content": RESULT + self._run_calculator(expression)}]
        return demonstrations

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


def steps(expression: str) -> list[str]:
    """`expression`'s operations one by one, each on the results before it, in the order they
    are computed (left operand first): '(4 * 26 - 103) * 6' -> ['4 * 26', '104 - 103', '1 * 6']."""
    import ast

    found: list[str] = []

    def walk(node: ast.AST) -> str:
        if isinstance(node, ast.BinOp):
            symbol = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}.get(type(node.op))
            if symbol is None:
                raise ExamplesError(f"{expression!r}: expected only + - * / between numbers")
            found.append(f"{walk(node.left)} {symbol} {walk(node.right)}")
            return format_number(evaluate(found[-1]))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return str(node.value)
        raise ExamplesError(f"{expression!r}: expected only whole numbers, + - * / and parentheses")

    value = walk(ast.parse(expression, mode="eval").body)
    return found or [value]
