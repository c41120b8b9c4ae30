"""`tracetrain optimize-prompt`: one optimisation run of the task agent's system prompt."""

from __future__ import annotations

import contextlib
import json

import typer
from rich.console import Console


def optimize_prompt(
    task: str = typer.Option("calc", help="The task whose agent's system prompt is optimised "
                             "(calc: the plain openai agent)."),
    rounds: int = typer.Option(None, min=1, help="Critique -> rewrite -> evaluate rounds "
                               "(default optimizer.rounds, 2)."),
    candidates: int = typer.Option(None, min=1, help="Rewrites evaluated per round (default "
                                   "optimizer.candidates, 2)."),
    n_val: int = typer.Option(None, "--n-val", min=1, help="Validation problems each prompt "
                              "is scored on (default optimizer.n_val, 48)."),
) -> None:
    """Improve the agent's system prompt from its own traffic, without training.

    Reads the agent's rollouts (spans and final rewards) from Kafka with a consumer group of
    its own (optimizer.group_id), from where its last run stopped; shows the lowest-reward
    ones (optimizer.worst_k) to an optimiser LLM (optimizer.llm_base_url, any OpenAI-compatible
    endpoint; unset: the engine the prompts are evaluated on), which critiques them and
    rewrites the prompt; scores the prompt in use and every rewrite on a validation split
    (optimizer.n_val problems, greedy) through the real agent on an engine of its own
    (optimizer.engine_url to use another, never the gateway); registers each in MLflow's
    prompt registry as a version of optimizer.prompt_name with its score and lineage tags
    (parent version, rollout ids, topic offsets), and moves optimizer.alias to the best.
    Agents read it with --prompt prompts:/NAME@ALIAS (tracetrain eval) or
    CalcAgent(prompt_uri=...). Prints one JSON line last. Every optimizer.* setting is also
    TRACETRAIN_OPTIMIZER__NAME.
    """
    from demo import evaluate
    from demo.tasks import get_task
    from examples.calc.agent import DEFAULT_STYLE, STYLES
    from optimizer.registry import PromptStore
    from optimizer.rollouts import read_rollouts
    from optimizer.search import OptimiserLlm, optimise, require_rollouts
    from tracetrain.settings import get_settings

    if task != "calc":
        raise typer.BadParameter(f"{task!r}: expected calc (the one task with one system "
                                 "prompt to tune)", param_hint="--task")
    settings = get_settings()
    given = {"rounds": rounds, "candidates": candidates, "n_val": n_val}
    opts = settings.optimizer.model_copy(update={k: v for k, v in given.items() if v is not None})
    settings = settings.model_copy(update={"optimizer": opts})
    chosen = get_task(task)
    console = Console(stderr=True)
    store = PromptStore(settings)
    current = store.current()
    # the prompt of the style `chosen` solves in
    seed = current if current is not None else (None, STYLES[DEFAULT_STYLE][0])
    batch = read_rollouts(settings)
    console.print(f"read {len(batch.rollouts)} rollouts of agent {opts.agent!r} "
                  f"({batch.skipped} records skipped)")
    try:
        require_rollouts(batch, opts)  # before an engine is started for nothing
        problems = chosen.problems(opts.n_val, opts.val_seed, settings.home_dir / "optimizer",
                                   split="train")
        engine = (contextlib.nullcontext((opts.engine_url, "given")) if opts.engine_url
                  else evaluate.own_engine(settings, name="optimizer-engine", slots=opts.threads))
        with engine as (url, _):
            llm = OptimiserLlm(opts.llm_base_url or url, opts)

            def score(text: str, label: str) -> float:
                rewards = evaluate.with_progress(chosen, problems, url, label, opts.threads,
                                                 console, system_prompt=text)
                return sum(rewards) / len(rewards)

            result = optimise(opts, seed, batch, llm, score, store)
        batch.commit()  # only now: a failed run reads the same rollouts again
    finally:
        batch.close()
    typer.echo(json.dumps({"task": task, **result.summary(opts, len(batch.rollouts))}))
