"""The example tasks behind one small interface, so the demo, its traffic and `tracetrain eval`
treat calc, sql and rag alike: problems (generated from a seed or read from JSONL), the agent
that solves one through an OpenAI-compatible URL, its held-out score, and which agents the
streams train."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from demo.errors import DemoError
from examples.calc import problems as calc_problems
from examples.calc.agent import DEFAULT_STYLE, STYLES, CalcAgent
from examples.rag import questions as rag_questions
from examples.rag.agent import RagAgent
from examples.sql import databases as sql_databases
from examples.sql.agents import TRAINED_AGENTS, SqlTeam

TASKS = ("calc", "sql", "rag")
# Agent front ends per task: calc runs on a plain `openai` client (the default) or on AutoGen
# AgentChat with the calculator as a function tool (the `autogen` extra).
# The SQL team runs as plain code (the default) or as a LangGraph graph with langchain-openai
# clients (the `langgraph` extra), the paper's stack.
FRONT_ENDS = {"calc": ("openai", "autogen"), "sql": ("openai", "langgraph"), "rag": ("openai",)}
# What `tracetrain eval` and the demo's held-out figures measure per task: rag's is the mean
# token F1 of the answers (the paper's figure), not its reward (which adds a format score).
METRICS = {"calc": "accuracy", "sql": "accuracy", "rag": "f1"}


@dataclass(frozen=True)
class Task:
    name: str
    max_tokens: int
    trained_agents: str | None  # regex for the streams' agent selection; None: all
    front_end: str = "openai"
    style: str = DEFAULT_STYLE  # calc's plain agent: how it solves (examples/calc/agent.py)

    def problems(self, n: int, seed: int, folder: Path, *, split: str) -> list[Any]:
        """`split`: `train` for traffic, `heldout` for evaluation. Calc's and rag's held-out
        splits have phrasings that traffic never uses (examples/calc/phrasings.py,
        examples/rag/phrasings.py); sql has one kind of question, so its problems are held out
        by seed alone."""
        if self.name == "calc":
            return calc_problems.generate(n, seed, split=split)
        if self.name == "rag":
            return rag_questions.generate(n, seed, split=split)
        return sql_databases.generate(n, seed, folder / f"sql-dbs-{seed}")

    def demonstrations(self, n: int, seed: int) -> list[dict]:
        """Worked examples of `n` problems in the `train` split's phrasings, for the learner's
        warm start (learner/warm_start.py): calc's plain agent only, whose problems carry the
        expression that solves them."""
        if (self.name, self.front_end) != ("calc", "openai"):
            raise DemoError(f"a warm start: demonstrations are written for the calc task's openai "
                            f"front end, not for {self.name} on {self.front_end} (use "
                            "--warm-start 0)")
        # never called: it only writes the messages
        agent = CalcAgent("http://127.0.0.1:9/v1", style=self.style)
        return [row for problem in calc_problems.generate(n, seed, split="train")
                for row in agent.worked(problem)]

    def read(self, path: Path) -> list[Any]:
        reader = {"calc": calc_problems.read_jsonl, "rag": rag_questions.read_jsonl,
                  "sql": sql_databases.read_jsonl}[self.name]
        try:
            return reader(Path(path))
        except FileNotFoundError as exc:
            raise DemoError(f"problems file {path} does not exist") from exc

    def agent(self, base_url: str, tracer=None, temperature: float = 0.0,
              system_prompt: str | None = None):
        """`system_prompt`: calc's plain agent only (what `tracetrain optimize-prompt` tunes)."""
        if system_prompt is not None and (self.name, self.front_end) != ("calc", "openai"):
            raise DemoError(f"a system prompt is taken by the calc task's openai front end, not "
                            f"by {self.name} on {self.front_end}")
        if self.name == "calc" and self.front_end == "autogen":
            from examples.calc.autogen_agent import AutoGenCalcAgent

            return AutoGenCalcAgent(base_url, tracer, temperature=temperature,
                                    max_tokens=self.max_tokens)
        if self.name == "calc":
            return CalcAgent(base_url, tracer, temperature=temperature, max_tokens=self.max_tokens,
                             system_prompt=system_prompt, style=self.style)
        if self.name == "rag":
            return RagAgent(base_url, tracer, temperature=temperature, max_tokens=self.max_tokens)
        if self.front_end == "langgraph":
            from examples.sql.langgraph_team import LangGraphSqlTeam

            return LangGraphSqlTeam(base_url, tracer, temperature=temperature,
                                    max_tokens=self.max_tokens)
        return SqlTeam(base_url, tracer, temperature=temperature, max_tokens=self.max_tokens)

    @property
    def metric(self) -> str:
        return METRICS[self.name]

    def solve(self, agent, problem, task_id: str, seed: int | None = None) -> float:
        """One rollout; its reward (calc, sql: 1 correct, 0 not; rag: format + F1)."""
        return self.run(agent, problem, task_id, seed).reward

    def score(self, episode) -> float:
        """A rollout's held-out score (`metric`): its reward, or rag's answer F1."""
        return episode.f1 if self.name == "rag" else episode.reward

    def run(self, agent, problem, task_id: str, seed: int | None = None):
        """One rollout; its episode (the agent's record of it, with `.reward`)."""
        if self.name == "sql":
            return agent.solve(problem, task_id=task_id)
        return agent.solve(problem, task_id=task_id, seed=seed)


def get_task(name: str, front_end: str = "openai", style: str | None = None) -> Task:
    """`style`: how calc's plain agent solves (`expression`, the default, or `steps`)."""
    if name not in TASKS:
        raise DemoError(f"task {name!r}: expected one of {', '.join(TASKS)}")
    if front_end not in FRONT_ENDS[name]:
        raise DemoError(f"front end {front_end!r} for task {name}: expected one of "
                         f"{', '.join(FRONT_ENDS[name])}")
    if style is not None and (name, front_end) != ("calc", "openai"):
        raise DemoError(f"a calc style ({style!r}) is taken by the calc task's openai front end, "
                        f"not by {name} on {front_end}")
    if style is not None and style not in STYLES:
        raise DemoError(f"calc style {style!r}: expected one of {', '.join(STYLES)}")
    if name == "calc":
        # AutoGen's turns carry tool-call JSON, longer than the plain agent's one-line turns.
        return Task("calc", max_tokens=64 if front_end == "autogen" else 32,
                    trained_agents=None, front_end=front_end, style=style or DEFAULT_STYLE)
    if name == "rag":
        # a search query or a short answer per turn
        return Task("rag", max_tokens=32, trained_agents=None)
    return Task("sql", max_tokens=96, trained_agents="|".join(TRAINED_AGENTS),
                front_end=front_end)
