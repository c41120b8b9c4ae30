"""`tracetrain demo` (the closed loop) and `tracetrain eval` (held-out accuracy)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import typer
from rich.console import Console

from demo.tasks import FRONT_ENDS, TASKS, get_task
from tracetrain.modes import LEARNER_MODES, REGISTRY_ALIASES, one_of

STYLE_HELP = ("How calc's plain agent solves: expression (the whole problem as one "
              "expression; the default) or steps (one operation a calculator call, each on the "
              "result before it). Evaluate a version with the style it was trained in.")
FRONT_END_HELP = ("The agent's framework: openai (plain client); for calc, autogen (AutoGen "
                  "AgentChat with a function tool; pip install 'tracetrain\\[autogen]'); for sql, "
                  "langgraph (the team as a LangGraph graph; pip install 'tracetrain\\[langgraph]').")

console = Console()
MINUTES, WITHIN = 10.0, 30.0  # the defaults of --minutes and (with them) --within


def demo(
    minutes: float = typer.Option(MINUTES, help="Minutes of training traffic (evaluations and "
                                  "start-up come on top; the defaults end within 30 minutes)."),
    within: float = typer.Option(None, min=0, help="Minutes the whole run may take: the traffic "
                                 "ends early where the start-up and the warm start left too "
                                 "little time for all of --minutes and the final evaluation "
                                 "(about 5 minutes). Default: 30 with the default --minutes, no "
                                 "bound with another; 0: no bound."),
    task: str = typer.Option("calc", help=f"One of: {', '.join(TASKS)}."),
    front_end: str = typer.Option("openai", "--front-end", help=FRONT_END_HELP),
    workers: int = typer.Option(16, min=1, help="Agent threads sending rollouts through the gateway."),
    slots: int = typer.Option(16, min=1, help="Sequences the engine generates at once (llama-server "
                              "parallel slots); also how many problems an eval solves at once."),
    mode: str = typer.Option(None, help=f"Learner mode: {one_of(LEARNER_MODES)} (default sft)."),
    compare: str = typer.Option(None, help="Learner modes to run one after another instead of "
                                "--mode, comma-separated (rl,sft): the same options, problems and "
                                "minutes each, then one picture of their held-out accuracy "
                                "against minutes (home/demo/compare.png) and a JSON line."),
    n_eval: int = typer.Option(200, "--n-eval", min=1, help="Held-out problems for base and final accuracy."),
    version_eval: int = typer.Option(32, min=0, help="Held-out problems checked at each new "
                                     "version (0: none)."),
    temperature: float = typer.Option(0.3, min=0.0, help="Sampling temperature of the agents "
                                      "(exploration)."),
    lr: float = typer.Option(3e-4, min=0.0, help="Learning rate of the learner on traffic."),
    lora_targets: str = typer.Option("all", "--lora-targets", help="Layers the LoRA adapts: "
                                     "'all' (the seven linear layers of each block), "
                                     "'attention' (q_proj,v_proj: the learner's own default) or "
                                     "a comma-separated list of module names."),
    group_size: int = typer.Option(4, min=2, help="Rollouts per training problem (GRPO group)."),
    learner_threads: int = typer.Option(1, min=1, help="torch threads of the learner "
                                        "(it shares the cores with the engine)."),
    warm_start: int = typer.Option(None, "--warm-start", min=0, help="Worked problems (of the "
                                   "training phrasings) the learner imitates before any traffic, "
                                   "served as version 1 (calc's openai front end; default 1300 "
                                   "there in sft and rl, 450 in kto, whose loss runs every row "
                                   "whole, 0 elsewhere; 0: none)."),
    rehearsal: int = typer.Option(None, "--rehearsal", min=0, help="Worked problems (others "
                                  "than the warm start's) the learner imitates in every traffic "
                                  "step beside the traffic, so that it cannot drift from them "
                                  "(calc's openai front end, default 4 there; 0: none)."),
    calc_style: str = typer.Option(None, "--calc-style", help=STYLE_HELP),
    engine_threads: int = typer.Option(1, min=1, help="llama-server threads of the engine (it "
                                       "shares the cores with the learner: more threads than "
                                       "free cores slow llama.cpp down)."),
) -> None:
    """Agents improving from their own traffic: brings the stack up (Kafka, MLflow, engine,
    Faust worker, gateway, learner, reloader), runs agent workers through the gateway, shows a
    live dashboard, then reports held-out accuracy of the base model against the final version
    and writes demo/summary.json and a reward curve under the state folder. With --compare, one
    such run per mode, then demo/compare.png and one JSON line of every mode's figures."""
    from demo import compare as comparison
    from demo.run import DemoOptions, DemoRun
    from tracetrain.settings import get_settings

    # Every option is checked before anything starts: a comparison runs for half an hour or more
    if mode is not None and compare is not None:
        raise typer.BadParameter("give --mode or --compare, not both", param_hint="--compare")
    if compare is not None:
        try:
            modes = comparison.parse_modes(compare)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--compare") from exc
    else:
        modes = (mode or DemoOptions.mode,)
    if modes[0] not in LEARNER_MODES:
        raise typer.BadParameter(f"{mode!r}: expected {one_of(LEARNER_MODES)}", param_hint="--mode")
    if task not in TASKS:
        raise typer.BadParameter(f"{task!r}: expected one of {', '.join(TASKS)}", param_hint="--task")
    if front_end not in FRONT_ENDS[task]:
        raise typer.BadParameter(f"{front_end!r} for --task {task}: expected one of "
                                 f"{', '.join(FRONT_ENDS[task])}", param_hint="--front-end")
    try:
        get_task(task, front_end, calc_style)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--calc-style") from exc
    opts = DemoOptions(task=task, front_end=front_end, minutes=minutes, workers=workers, slots=slots,
                       mode=modes[0], n_eval=n_eval, version_eval_n=version_eval, group_size=group_size,
                       temperature=temperature, lr=lr, learner_threads=learner_threads,
                       engine_threads=engine_threads, warm_start=warm_start, rehearsal=rehearsal,
                       lora_targets=parse_lora_targets(lora_targets), calc_style=calc_style,
                       within=_within(within, minutes))
    settings = get_settings()
    _stop_on_sigterm()
    if compare is not None:
        summaries = comparison.run_modes(settings, opts, modes, console)
        typer.echo(json.dumps(comparison.save(summaries, settings.home_dir / "demo")))
        return
    summary = DemoRun(settings, opts, console).run()
    typer.echo(json.dumps({k: summary[k] for k in ("task", "metric", "base_accuracy",
                                                   "final_accuracy", "n", "minutes", "versions",
                                                   "mean_reload_s")}))


def _stop_on_sigterm() -> None:
    """`kill <pid>` (a job's time limit, a supervisor) stops what the demo or eval started, as
    Ctrl-C does (without Ctrl-C's final evaluation). Python's default for SIGTERM ends the
    process without its `finally` blocks: Kafka, MLflow, the engine and the stages stayed up,
    and the next demo found their ports taken. A second SIGTERM is ignored, so that it cannot
    cut the clean-up short (SIGKILL still ends it)."""
    def stop(signum, _frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def parse_lora_targets(text: str) -> tuple[str, ...]:
    from tracetrain.settings.learner import LORA_ALL_LINEAR, LORA_ATTENTION

    named = {"all": LORA_ALL_LINEAR, "attention": LORA_ATTENTION}
    targets = named.get(text) or tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [name for name in targets if name not in LORA_ALL_LINEAR]
    if not targets or unknown:
        raise typer.BadParameter(f"{text!r}: expected 'all', 'attention' or module names from "
                                 f"{', '.join(LORA_ALL_LINEAR)}", param_hint="--lora-targets")
    return targets


def eval_command(
    task: str = typer.Option("calc", help=f"One of: {', '.join(TASKS)}."),
    front_end: str = typer.Option("openai", "--front-end", help=FRONT_END_HELP),
    problems: str = typer.Option(None, help="JSONL problems: {question, answer} for calc and "
                                  "rag, {db, question, gold_sql} for sql (default: generated)."),
    n: int = typer.Option(200, min=1, help="Generated problems (ignored with --problems)."),
    seed: int = typer.Option(None, help="Seed of the generated problems (default: the demo's "
                             "held-out seed, never trained on)."),
    split: str = typer.Option("heldout", help="Phrasings of generated calc and rag problems: "
                              "heldout (scenarios and question templates the demo's traffic never "
                              "uses) or train (those it trains on)."),
    version: str = typer.Option(None, help="A registered version number, or `base`."),
    alias: str = typer.Option(None, help="A registry alias instead of a version "
                              f"({', '.join(REGISTRY_ALIASES)})."),
    threads: int = typer.Option(16, min=1, help="Problems solved at once (the eval engine "
                                "runs as many parallel slots). 1 gives the same scores on every "
                                "run; with more, batched decoding can flip a borderline answer "
                                "between runs (llama.cpp's kernels round differently per batch "
                                "size), for about 1.3x less time."),
    per_agent: bool = typer.Option(False, "--per-agent", help="sql only: each agent's figures "
                                   "too (the Writer's first query and how it fails, the "
                                   "Checker's agreement with the truth, the Rewriter's "
                                   "repairs) and rollouts per minute."),
    calc_style: str = typer.Option(None, "--calc-style", help=STYLE_HELP),
    prompt: str = typer.Option(None, help="The agent's system prompt from MLflow's prompt "
                               "registry, e.g. prompts:/calc-system@production (what "
                               "`tracetrain optimize-prompt` registers; calc, openai front end)."),
) -> None:
    """Held-out accuracy of a registered version (or the base model) through the task's agent,
    greedy. Starts an engine of its own on a free port and stops it after; prints one JSON line
    last: task, version, n, accuracy (rag: the mean token F1 of the answers), metric (and
    prompt, with --prompt)."""
    from demo import evaluate
    from examples.calc.phrasings import SPLITS
    from tracetrain.settings import get_settings

    if split not in SPLITS:
        raise typer.BadParameter(f"{split!r}: expected one of {', '.join(SPLITS)}",
                                 param_hint="--split")
    if version is not None and alias is not None:
        raise typer.BadParameter("give --version or --alias, not both", param_hint="--alias")
    if version not in (None, "base") and not version.isdigit():
        raise typer.BadParameter(f"{version!r}: expected a version number or `base`",
                                 param_hint="--version")
    try:
        chosen = get_task(task, front_end, calc_style)
    except ValueError as exc:
        hint = ("--calc-style" if "style" in str(exc) else
                "--front-end" if "front end" in str(exc) else "--task")
        raise typer.BadParameter(str(exc), param_hint=hint) from exc
    settings = get_settings()
    system_prompt = None
    if prompt is not None:
        from examples.prompts import load_prompt

        if (task, front_end) != ("calc", "openai"):
            raise typer.BadParameter(f"takes --task calc with the openai front end, not {task} "
                                     f"on {front_end}", param_hint="--prompt")
        system_prompt = load_prompt(prompt, tracking_uri=settings.mlflow.uri)
    folder = settings.home_dir / "eval"
    try:
        items = chosen.read(Path(problems)) if problems else chosen.problems(
            n, evaluate.HELD_OUT_SEED if seed is None else seed, folder, split=split)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--problems") from exc
    if per_agent and task != "sql":
        raise typer.BadParameter(f"--per-agent is for --task sql, not {task!r}",
                                 param_hint="--per-agent")
    number = int(version) if version not in (None, "base") else None
    episodes: list = []
    _stop_on_sigterm()
    with evaluate.own_engine(settings, version=number, alias=alias,
                                 slots=threads) as (url, label):
        started = time.monotonic()
        rewards = evaluate.with_progress(chosen, items, url, f"{task} version {label}",
                                         threads=threads, console=Console(stderr=True),
                                         episodes=episodes, system_prompt=system_prompt)
        minutes = (time.monotonic() - started) / 60
    result = evaluate.EvalResult(task, label, len(rewards), sum(rewards) / max(1, len(rewards)),
                                 rewards, chosen.metric)
    line = result.summary()
    if prompt:
        line["prompt"] = prompt
    if per_agent:
        from examples.sql.breakdown import breakdown

        line.update(per_agent=breakdown(episodes),
                    rollouts_per_minute=round(len(rewards) / max(minutes, 1e-9), 2))
    typer.echo(json.dumps(line))


def _within(within: float | None, minutes: float) -> float | None:
    """--within as given (0: no bound); unset, 30 where --minutes is its default (the demo's
    30-minute promise), no bound where someone asked for other minutes of traffic."""
    if within is None:
        return WITHIN if minutes == MINUTES else None
    return within or None
