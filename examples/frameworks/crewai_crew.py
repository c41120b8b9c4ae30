"""A CrewAI crew that knows nothing of tracetrain: only its LLM's base URL points at the gateway.

    .venv-crewai/bin/python examples/frameworks/crewai_crew.py \\
        --base-url http://127.0.0.1:8000/rollouts/ro-crew-1/v1 --api-key KEY

CrewAI cannot share tracetrain's environment (it pins an older openai, openai-agents and
pydantic), so the crew runs in its own (`make crewai-venv`, from
examples/frameworks/crewai-requirements.txt) as a separate process, as a user's agent service
would. The rollout id in the base URL's path (`/rollouts/{id}/v1`) is what groups the crew's
calls into one rollout: no header, no tracer, no tracetrain import.

Two agents in sequence, a solver and a checker; `openai/<model>` with a `base_url` is CrewAI's
native OpenAI provider on a custom endpoint. Telemetry and CrewAI's trace upload stay off (the
process may have no internet). Prints one JSON line last: the crew's answer and how many LLM
calls CrewAI made (counted from its own event bus), so a caller can check that each became a
span.
"""

from __future__ import annotations

import argparse
import json
import os

# CrewAI reads these when it is imported: no telemetry, no trace upload, no first-run prompt.
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

from crewai import LLM, Agent, Crew, Process, Task  # noqa: E402
from crewai.events import LLMCallCompletedEvent, LLMCallFailedEvent, crewai_event_bus  # noqa: E402


def build_crew(base_url: str, api_key: str, model: str, max_tokens: int) -> Crew:
    llm = LLM(model=f"openai/{model}", base_url=base_url, api_key=api_key, temperature=0.0,
              max_tokens=max_tokens, max_retries=0)
    # max_iter bounds each agent's loop (CrewAI re-asks when it cannot parse an answer), so a
    # weak model ends the crew in a few calls.
    common = {"llm": llm, "max_iter": 2, "max_retry_limit": 0, "allow_delegation": False,
              "verbose": False}
    solver = Agent(role="Solver", goal="Answer arithmetic questions with a number.",
                   backstory="You compute sums exactly.", **common)
    checker = Agent(role="Checker", goal="Check an answer and restate the number.",
                    backstory="You verify arithmetic.", **common)
    solve = Task(description="What is 2 + 3?", expected_output="A number.", agent=solver)
    check = Task(description="Check the solver's answer to 2 + 3 and give the number.",
                 expected_output="A number.", agent=checker, context=[solve])
    return Crew(agents=[solver, checker], tasks=[solve, check], process=Process.sequential,
                memory=False, verbose=False, tracing=False)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="the gateway, e.g. URL/rollouts/ID/v1")
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--model", default="policy")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args(argv)

    calls = {"completed": 0, "failed": 0}

    @crewai_event_bus.on(LLMCallCompletedEvent)
    def _completed(_source, _event):
        calls["completed"] += 1

    @crewai_event_bus.on(LLMCallFailedEvent)
    def _failed(_source, _event):
        calls["failed"] += 1

    result = build_crew(args.base_url, args.api_key, args.model, args.max_tokens).kickoff()
    crewai_event_bus.flush()  # handlers may run on its worker threads
    report = {"answer": str(result.raw), "llm_calls": calls["completed"],
              "failed_calls": calls["failed"],
              "tasks": [str(out.raw) for out in result.tasks_output]}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
