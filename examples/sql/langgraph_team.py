"""The SQL team on LangGraph with `langchain-openai` clients, the paper's stack (the `langgraph`
extra): the same Writer, Checker and Rewriter, prompts and tool as examples/sql/agents.py, as
a graph. The only change that points it at tracetrain is the client's base URL (and the
rollout headers each call carries), so the streams train the Writer and the Rewriter and keep
the Checker frozen exactly as for the plain-code team.

    team = LangGraphSqlTeam(base_url="http://127.0.0.1:8000/v1", tracer=tracer)
    episode = team.solve(task)

    writer -> execute -> checker --accepted or last round--> END
                 ^            \\--> rewriter --rounds left--> execute
"""

from __future__ import annotations

from typing import TypedDict

from examples.errors import ExamplesError
from examples.sql.agents import (
    PROMPTS,
    SqlEpisode,
    SqlTeam,
    accepted,
    extract_sql,
    question_context,
    round_context,
)
from examples.sql.databases import SqlTask
from examples.sql.execution import reward


class _State(TypedDict):
    sql: str
    shown: str
    verdict: str


class LangGraphSqlTeam(SqlTeam):
    def __init__(self, base_url: str, tracer=None, model: str = "policy", max_rounds: int = 2,
                 max_tokens: int = 96, temperature: float = 1.0, api_key: str = "none"):
        super().__init__(base_url, tracer, model, max_rounds, max_tokens, temperature, api_key)
        try:
            from langchain_openai import ChatOpenAI
        except ImportError as exc:
            raise ExamplesError("the LangGraph SQL team needs the `langgraph` extra: "
                                "pip install 'tracetrain[langgraph]'") from exc
        self.llm = ChatOpenAI(base_url=base_url, api_key=api_key, model=model,
                              max_tokens=max_tokens, temperature=temperature, max_retries=2,
                              timeout=120.0)

    def _ask(self, agent: str, system: str, user: str, headers: dict) -> str:
        # the plain team's messages: langchain-openai takes OpenAI-style dicts as they are
        reply = self.llm.invoke(self.messages(agent, system, user),
                                extra_headers={**headers, "X-Agent-Name": agent})
        return reply.content if isinstance(reply.content, str) else ""

    def _episode(self, task: SqlTask, task_id: str, rollout_id: str) -> SqlEpisode:
        from langgraph.graph import END, START, StateGraph

        episode = SqlEpisode(task, rollout_id)
        headers = {"X-Rollout-Id": rollout_id, "X-Task-Id": task_id}
        context = question_context(task)

        def writer(state: _State) -> dict:
            return {"sql": extract_sql(self._ask("writer", PROMPTS["writer"], context, headers))}

        def execute(state: _State) -> dict:
            episode.queries.append(state["sql"])
            return {"shown": self.shown(task.db, state["sql"])}

        def checker(state: _State) -> dict:
            verdict = self._ask("checker", PROMPTS["checker"],
                                round_context(context, state["sql"], state["shown"]), headers)
            episode.verdicts.append(verdict)
            return {"verdict": verdict}

        def rewriter(state: _State) -> dict:
            rewrite = self._ask("rewriter", PROMPTS["rewriter"],
                                f"{round_context(context, state['sql'], state['shown'])}\n"
                                f"Feedback: {state['verdict']}", headers)
            return {"sql": extract_sql(rewrite) or state["sql"]}

        def after_check(state: _State) -> str:
            return END if accepted(state["verdict"], state["shown"]) else "rewriter"

        def after_rewrite(state: _State) -> str:
            return END if len(episode.queries) >= self.max_rounds else "execute"

        graph = StateGraph(_State)
        for name, node in (("writer", writer), ("execute", execute), ("checker", checker),
                           ("rewriter", rewriter)):
            graph.add_node(name, node)
        graph.add_edge(START, "writer")
        graph.add_edge("writer", "execute")
        graph.add_edge("execute", "checker")
        graph.add_conditional_edges("checker", after_check)
        graph.add_conditional_edges("rewriter", after_rewrite)
        final = graph.compile().invoke({"sql": "", "shown": "", "verdict": ""})
        episode.reward = reward(task.db, final["sql"], task.gold_sql)
        return episode
