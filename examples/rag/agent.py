"""The rag agent: a plain `openai` client pointed at the gateway, with a search tool over the
corpus (after the Agent Lightning paper's MuSiQue agent).

    agent = RagAgent(base_url="http://127.0.0.1:8000/v1", tracer=tracer)
    episode = agent.solve(question)      # one rollout: LLM calls, searches, final reward

The policy writes `<tool>search: WORDS</tool>`; the top documents come back as the next user
turn (examples/tool_loop.py runs the turns); it must end with `ANSWER: <answer>`. The reward is
a format score plus the answer's token F1 (examples/rag/reward.py). A search that finds nothing
or repeats a query is a failed tool span (examples/rag/retrieval.py), which the AIR deriver
credits to the LLM call that asked for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from examples.rag.questions import Question
from examples.rag.retrieval import SearchTool, bm25_index
from examples.rag.reward import f1, reward
from examples.tool_loop import ToolLoopAgent

SYSTEM_PROMPT = (
    "You answer questions about a collection of articles. To look something up, write one line "
    "<tool>search: WORDS</tool> and stop; the best matching articles come back. Search for one "
    "fact at a time, with names from the question or from earlier results. When you know the "
    "answer, write ANSWER: <answer>."
)
# One worked two-hop exchange, about names the corpus never generates (its names are one
# invented word plus a suffix): SmolLM2-135M copies a demonstrated format, as calc found.
DEMONSTRATION = [
    {"role": "user", "content": "In which city was the founder of Juniper Hollow Foods born?"},
    {"role": "assistant", "content": "<tool>search: Juniper Hollow Foods founder</tool>"},
    {"role": "user", "content": "Result: 1. Juniper Hollow Foods is a company founded by Hollis "
     "Wyatt in 1962. Juniper Hollow Foods is headquartered in Ashcombe.\n2. Marla Wyatt is a "
     "pilot born in Ashcombe in 1970. She works for Juniper Hollow Foods."},
    {"role": "assistant", "content": "<tool>search: Hollis Wyatt born</tool>"},
    {"role": "user", "content": "Result: 1. Hollis Wyatt is a baker born in Elmcaster in 1931. "
     "He works for Juniper Hollow Foods.\n2. Elmcaster is a city in Westmoor, on the river Lune. "
     "The mayor of Elmcaster is Hollis Wyatt."},
    {"role": "assistant", "content": "ANSWER: Elmcaster"},
]


@dataclass
class Episode:
    question: Question
    rollout_id: str
    transcript: list[dict] = field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0     # searches that found nothing or repeated a query
    retrieved: list[str] = field(default_factory=list)  # document ids the searches returned
    reward: float = 0.0
    f1: float = 0.0
    final_text: str = ""


class RagAgent(ToolLoopAgent):
    TOOL, AGENT, REWARD_NAME = "search", "rag", "format_f1"

    def __init__(self, base_url: str, tracer=None, index=None, max_turns: int = 5,
                 max_tokens: int = 32, **options):
        super().__init__(base_url, tracer, max_turns=max_turns, max_tokens=max_tokens, **options)
        self.index = index or bm25_index()

    def solve(self, question: Question, task_id: str | None = None,
              seed: int | None = None) -> Episode:
        task_id = task_id or f"rag-{abs(hash(question.question)) % 10**10}"
        search = SearchTool(self.index)
        with self.rollout(task_id) as (rollout_id, publish):
            episode = Episode(question, rollout_id)
            episode.transcript = [{"role": "system", "content": SYSTEM_PROMPT}, *DEMONSTRATION,
                                  {"role": "user", "content": question.question}]
            episode.final_text, episode.tool_calls, episode.tool_errors = self.loop(
                episode.transcript, task_id, rollout_id, seed, self.traced(search))
            episode.retrieved = search.found
            episode.reward = reward(episode.final_text, question.answer)
            episode.f1 = f1(episode.final_text, question.answer)
            publish(episode.reward)
        return episode
