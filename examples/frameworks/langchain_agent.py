"""A LangChain agent that knows nothing of tracetrain: only its model's base URL points at the
gateway.

    python -m examples.frameworks.langchain_agent --base-url http://127.0.0.1:8000/rollouts/ro-1/v1

`langchain.agents.create_agent` over `langchain_openai.ChatOpenAI` with one tool (`add`): the
agent loop asks the model, runs the tools it calls and asks again until the model answers in
text. The rollout id in the base URL's path (`/rollouts/{id}/v1`) groups every model call of
the run into one rollout; no header, tracer or tracetrain import is involved.
`ModelCallLimitMiddleware` ends the run after `max_calls` model calls, so a weak model that
keeps calling the tool still ends. Prints one JSON line last: the answer, the model calls the
agent made and the tool calls it ran (both read from the run's own messages).
"""

from __future__ import annotations

import argparse
import json

from langchain.agents import create_agent
from langchain.agents.middleware import ModelCallLimitMiddleware
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

QUESTION = "What is 2 + 3? Use the add tool, then answer with the number."


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def build_agent(base_url: str, api_key: str = "none", model: str = "policy",
                max_tokens: int = 48, max_calls: int = 3):
    llm = ChatOpenAI(base_url=base_url, api_key=api_key, model=model, temperature=0.0,
                     max_tokens=max_tokens, max_retries=0)
    return create_agent(llm, tools=[add], system_prompt="You add numbers with the add tool.",
                        middleware=[ModelCallLimitMiddleware(run_limit=max_calls,
                                                             exit_behavior="end")])


def run(base_url: str, question: str = QUESTION, **options) -> dict:
    """Run the agent once: {"answer", "llm_calls", "tool_calls", "messages"}."""
    messages = build_agent(base_url, **options).invoke(
        {"messages": [{"role": "user", "content": question}]})["messages"]
    # Each AIMessage is one model call; the limit middleware may add a closing AIMessage of
    # its own, which carries no response metadata (no call was made for it).
    answers = [m for m in messages if isinstance(m, AIMessage) and m.response_metadata]
    return {"answer": answers[-1].content if answers else "",
            "llm_calls": len(answers),
            "tool_calls": sum(isinstance(m, ToolMessage) for m in messages),
            "messages": messages}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="the gateway, e.g. URL/rollouts/ID/v1")
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--model", default="policy")
    args = parser.parse_args(argv)
    result = run(args.base_url, api_key=args.api_key, model=args.model)
    print(json.dumps({k: v for k, v in result.items() if k != "messages"}))
    return result


if __name__ == "__main__":
    main()
