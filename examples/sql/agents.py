"""The text-to-SQL multi-agent: a Writer, a Checker and a Rewriter, as in Agent Lightning.

    team = SqlTeam(base_url="http://127.0.0.1:8000/v1", tracer=tracer)
    episode = team.solve(task)           # one rollout; reward 1 when the result matches gold

The Writer drafts a query from the schema and question; the query runs (a tool span:
`execute_sql`, failed on an SQL error so that the AIR deriver can penalise it); the Checker
judges the query with its result and answers CORRECT or WRONG; on WRONG the Rewriter writes a
new query from the feedback, up to `max_rounds`. Every call goes through the gateway with its
agent name in `X-Agent-Name`, so the streams' agent selection can train the Writer and the
Rewriter while the Checker, which shares the model, stays frozen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import openai

from examples.errors import ExamplesError
from examples.sql.databases import SqlTask, schema_text
from examples.sql.execution import Execution, execute, reward

TRAINED_AGENTS = ("writer", "rewriter")  # the streams' agent selection for this example
# One worked exchange before the Writer's question, on a schema no task uses: SmolLM2-135M
# invents column names from the question without one (README: the SQL team's figures), and
# copies a demonstrated shape.
DEMONSTRATIONS = {
    "writer": [
        {"role": "user", "content": "Schema:\nCREATE TABLE animals (id INTEGER PRIMARY KEY, "
                                    "name TEXT, species TEXT, age INTEGER);\nQuestion: How many "
                                    "animals are older than 4?"},
        {"role": "assistant", "content": "SELECT COUNT(*) FROM animals WHERE age > 4"},
    ],
}
# Each agent's system prompt; the user turn is `question_context` (+ its round's query and
# result).
PROMPTS = {
    "writer": "Write one SQLite SELECT query that answers the question. Reply with the query only.",
    "checker": "You check SQL queries. Answer CORRECT or WRONG, then one sentence why.",
    "rewriter": "Rewrite the SQLite query so that it answers the question. Reply with the query "
                "only.",
}
_SQL_RE = re.compile(r"```(?:sql)?\s*(.*?)```|(SELECT\b.*)", re.IGNORECASE | re.DOTALL)


class SqlExecutionError(ExamplesError):
    """Raised inside the traced tool so that the tool span records ok=false with the error."""


def extract_sql(text: str) -> str:
    match = _SQL_RE.search(text or "")
    if not match:
        return ""
    sql = (match.group(1) or match.group(2) or "").strip()
    return sql.split(";")[0].strip()


@dataclass
class SqlEpisode:
    task: SqlTask
    rollout_id: str
    queries: list[str] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)
    reward: float = 0.0


class SqlTeam:
    def __init__(self, base_url: str, tracer=None, model: str = "policy", max_rounds: int = 2,
                 max_tokens: int = 96, temperature: float = 1.0, api_key: str = "none"):
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=2, timeout=120.0)
        self.tracer, self.model, self.max_rounds = tracer, model, max_rounds
        self.max_tokens, self.temperature = max_tokens, temperature
        self._run = tracer.tool(name="execute_sql")(self._execute) if tracer else self._execute
        self.demonstrations = DEMONSTRATIONS

    @staticmethod
    def _execute(db: str, sql: str) -> list:
        result = execute(db, sql)
        if not result.ok:
            raise SqlExecutionError(result.error)
        return [list(row) for row in result.rows]

    def _run_sql(self, db: str, sql: str) -> Execution:
        try:
            return Execution([tuple(r) for r in self._run(db, sql)], None)
        except SqlExecutionError as exc:
            return Execution(None, str(exc))

    def _ask(self, agent: str, system: str, user: str, headers: dict) -> str:
        completion = self.client.chat.completions.create(
            model=self.model, max_tokens=self.max_tokens, temperature=self.temperature,
            messages=self.messages(agent, system, user),
            extra_headers={**headers, "X-Agent-Name": agent},
        )
        return completion.choices[0].message.content or ""

    def solve(self, task: SqlTask, task_id: str | None = None) -> SqlEpisode:
        task_id = task_id or f"sql-{abs(hash((task.db, task.question))) % 10**10}"
        if self.tracer is None:
            return self._episode(task, task_id, f"untraced-{task_id}")
        with self.tracer.rollout(task_id=task_id, agent="sql-team") as rollout:
            episode = self._episode(task, task_id, rollout.rollout_id)
            rollout.reward(episode.reward, final=True, name="execution_match")
        return episode

    def _episode(self, task: SqlTask, task_id: str, rollout_id: str) -> SqlEpisode:
        episode = SqlEpisode(task, rollout_id)
        headers = {"X-Rollout-Id": rollout_id, "X-Task-Id": task_id}
        context = question_context(task)
        sql = extract_sql(self._ask("writer", PROMPTS["writer"], context, headers))
        for _ in range(self.max_rounds):
            episode.queries.append(sql)
            shown = self.shown(task.db, sql)
            verdict = self._ask("checker", PROMPTS["checker"], round_context(context, sql, shown),
                                headers)
            episode.verdicts.append(verdict)
            if accepted(verdict, shown):
                break
            rewrite = self._ask("rewriter", PROMPTS["rewriter"],
                                f"{round_context(context, sql, shown)}\nFeedback: {verdict}", headers)
            sql = extract_sql(rewrite) or sql
        episode.reward = reward(task.db, sql, task.gold_sql)
        return episode

    def messages(self, agent: str, system: str, user: str) -> list[dict]:
        return [{"role": "system", "content": system}, *self.demonstrations.get(agent, ()),
                {"role": "user", "content": user}]

    def shown(self, db: str, sql: str) -> str:
        """The query's outcome as the Checker and Rewriter see it (run as a traced tool)."""
        result = self._run_sql(db, sql)
        return f"error: {result.error}" if not result.ok else f"rows: {result.rows[:5]}"


def accepted(verdict: str, shown: str) -> bool:
    return "CORRECT" in verdict.upper() and not shown.startswith("error:")


def question_context(task: SqlTask) -> str:
    return f"Schema:\n{schema_text(task.db)}\nQuestion: {task.question}"


def round_context(context: str, sql: str, shown: str) -> str:
    return f"{context}\nQuery: {sql}\nResult {shown}"
