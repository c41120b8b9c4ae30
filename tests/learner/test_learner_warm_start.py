"""The learner's warm start: demonstrations trained before traffic, registered as version 1,
once (learner/warm_start.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from mlflow import MlflowClient
from transformers import AutoModelForCausalLM

from demo.errors import DemoError
from demo.tasks import get_task
from examples.calc.agent import CalcAgent, steps
from examples.calc.calculator import evaluate, format_number
from examples.calc.problems import generate
from examples.calc.reward import reward
from learner import warm_start
from learner.errors import LearnerError
from learner.loop import run_learner
from learner.trainer import PolicyTrainer
from testkit.learner import learner_settings, make_transition, produce
from tracetrain.settings import load_settings

DEMOS = [{"prompt": [{"role": "user", "content": f"What does the parrot say on day {i}?"}],
          "completion": [{"role": "assistant", "content": "Polly wants a cracker."}]}
         for i in range(6)]


def _write(path, rows) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_a_malformed_demonstration_is_refused_naming_its_line(tmp_path):
    path = tmp_path / "demos.jsonl"
    _write(path, [DEMOS[0], {"prompt": DEMOS[0]["prompt"], "completion": "a bare string"}])
    with pytest.raises(LearnerError, match=r"demos.jsonl:2: not a demonstration.*expected"):
        warm_start.read_demonstrations(path)
    with pytest.raises(LearnerError, match="no such file"):
        warm_start.read_demonstrations(tmp_path / "missing.jsonl")
    path.write_text("\n")
    with pytest.raises(LearnerError, match="holds no demonstration"):
        warm_start.read_demonstrations(path)


@pytest.mark.parametrize("style", ["steps", "expression"])
def test_a_worked_calc_problem_is_what_the_agent_sends_and_solves_it(style):
    agent = CalcAgent("http://127.0.0.1:9/v1", style=style)
    for problem in generate(12, seed=3):
        *calls, last = agent.worked(problem)
        assert calls[0]["prompt"] == agent.opening(problem)
        expressions = [c["completion"][0]["content"] for c in calls]
        # `steps`: one operation a call (the last one's result is the answer); `expression`:
        # the whole expression the problem was made from
        want = steps(problem.expression) if style == "steps" else [problem.expression]
        assert expressions == [f"<tool>calc: {e}</tool>" for e in want]
        assert evaluate(problem.expression) == problem.answer
        # each call sees the one before, its answer and the calculator's result, as in a rollout
        for before, after, call in zip(calls, [*calls[1:], last], expressions, strict=True):
            result = format_number(evaluate(call.removeprefix("<tool>calc: ").removesuffix(
                "</tool>")))
            assert after["prompt"] == [*before["prompt"], {"role": "assistant", "content": call},
                                       {"role": "user", "content": f"Result: {result}"}]
        assert after["prompt"][-1] == {"role": "user", "content": f"Result: {problem.answer}"}
        assert reward(last["completion"][0]["content"], problem.answer) == 1.0
    rows = get_task("calc", style=style).demonstrations(5, seed=11)
    worked = sum(len(agent.worked(p)) for p in generate(5, seed=11))
    assert len(rows) == worked and len({json.dumps(r) for r in rows}) == worked
    with pytest.raises(DemoError, match="--warm-start 0"):
        get_task("sql").demonstrations(5, seed=11)


@pytest.mark.parametrize("style", ["steps", "expression"])
def test_a_worked_problems_calls_are_trained_as_one_sequence_of_the_same_tokens(
        tmp_path, tiny_model_dir, style):
    """Chained, a calc problem's calls are one row whose tokens are exactly its last call's,
    trained on every completion and not on the calculator's results between them."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    path = tmp_path / "demos.jsonl"
    _write(path, get_task("calc", style=style).demonstrations(6, seed=5))
    apart = warm_start.transitions(path, tokenizer, chained=False)
    chained = warm_start.transitions(path, tokenizer)
    assert len(chained) == 6
    assert len(apart) > 12 if style == "steps" else len(apart) == 12  # steps: more calls
    first = 0
    for row in chained:
        calls = int(row["transition_id"].rsplit("-", 1)[1]) - first + 1
        own = apart[first:first + calls]
        assert row["transition_id"].endswith(f":{first}-{first + calls - 1}")
        assert row["prompt_token_ids"] == own[0]["prompt_token_ids"]
        sequence = row["prompt_token_ids"] + row["response_token_ids"]
        assert sequence == own[-1]["prompt_token_ids"] + own[-1]["response_token_ids"]
        trained = [tok for tok, keep in zip(row["response_token_ids"], row["tool_mask"],
                                            strict=True) if keep]
        assert trained == [tok for call in own for tok in call["response_token_ids"]]
        between = tokenizer.decode([tok for tok, keep in zip(
            row["response_token_ids"], row["tool_mask"], strict=True) if not keep])
        assert between.count("Result: ") == calls - 1 and "calc:" not in between
        first += calls
    assert first == len(apart)
    # a demonstration that does not continue the one before it starts a row of its own
    _write(path, DEMOS)
    assert len(warm_start.transitions(path, tokenizer)) == len(DEMOS)


def _completion_logprob(model, t: dict) -> float:
    ids = torch.tensor([t["prompt_token_ids"] + t["response_token_ids"]])
    with torch.no_grad():
        logps = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
    start = len(t["prompt_token_ids"]) - 1
    return float(logps[start:].gather(1, ids[0, start + 1:, None]).sum())


def test_the_cosine_schedule_rises_then_falls_to_a_tenth():
    # 40 steps: 2 rising (5%), then 38 falling; worked by hand from the cosine's halves
    rates = [warm_start.rate(k, 40, 2e-3, "cosine") for k in range(1, 41)]
    assert rates[:2] == pytest.approx([1e-3, 2e-3])
    assert rates[2] == pytest.approx(2e-4 + 1.8e-3 * 0.5 * (1 + math.cos(math.pi / 38)))
    assert rates[20] == pytest.approx(2e-4 + 1.8e-3 * 0.5)  # k=21: half way down the fall
    assert rates[-1] == pytest.approx(2e-4)
    assert all(a >= b for a, b in zip(rates[1:], rates[2:], strict=False))
    assert warm_start.rate(1, 1, 2e-3, "cosine") == pytest.approx(2e-3)  # one step: the peak
    assert {warm_start.rate(k, 40, 2e-3, "constant") for k in (1, 20, 40)} == {2e-3}
    with pytest.raises(LearnerError, match="'linear': expected constant or cosine"):
        warm_start.rate(1, 40, 2e-3, "linear")


def test_each_warm_start_step_takes_its_scheduled_rate_and_the_learners_comes_back(
        tiny_model_dir, tmp_path):
    path = tmp_path / "demos.jsonl"
    _write(path, DEMOS)
    settings = learner_settings(load_settings(home=tmp_path), tiny_model_dir, mode="sft",
                                batch_size=1, lr=1e-4, warm_start=path, warm_start_lr=1e-2,
                                warm_start_schedule="cosine")
    policy = PolicyTrainer(settings, tmp_path / "work")
    taken, totals = [], set()
    for _, total, _, _ in warm_start.steps(policy, path, epochs=2, threads=None):
        totals.add(total)
        # the optimizer has stepped at the group's rate; the constant scheduler then set it
        # again from the base rate, which the next step's rate replaces
        taken.append(policy.optimizer.param_groups[0]["lr"])
    assert totals == {12} and taken == pytest.approx(
        [warm_start.rate(k, 12, 1e-2, "cosine") for k in range(1, 13)])
    # 12 steps: one rising step (5% rounds up to 1) reaches the peak, then the fall to a tenth
    assert taken[0] == pytest.approx(1e-2) and taken[1] < taken[0]
    assert taken[-1] == pytest.approx(1e-3)
    assert [g["lr"] for g in policy.optimizer.param_groups] == [1e-4] * len(
        policy.optimizer.param_groups)
    assert policy.scheduler.base_lrs == [1e-4] * len(policy.optimizer.param_groups)


@pytest.mark.integration
@pytest.mark.mlflow
@pytest.mark.parametrize("mode", ["sft", "rl"])
def test_the_warm_start_is_learnt_registered_first_and_taken_once(
        mode, tmp_path, kafka_settings, mlflow_server, tiny_model_dir):
    path = tmp_path / "demos.jsonl"
    _write(path, DEMOS)
    base = kafka_settings.model_copy(update={"mlflow": mlflow_server})
    # The whole tiny model is trained: a LoRA of its random 32-wide layers barely moves the
    # demonstrations' likelihood (measured: 1 nat in 12 steps at 5e-2), the whole model does.
    settings = learner_settings(base, tiny_model_dir, mode=mode, batch_size=2, lr=1e-4,
                                full_finetune=True, advantage="batch", checkpoint_every_steps=50,
                                warm_start=path, warm_start_epochs=2, warm_start_lr=1e-2,
                                warm_start_threads=1)
    model = f"warm-{mode}-{settings.learner.group_id}"
    traffic = [make_transition(i, ret=float(i % 2)) for i in range(2)]
    produce(settings, traffic)
    warm_steps = 2 * len(DEMOS) // 2
    first = run_learner(settings, experiment=f"warm-{mode}", model_name=model,
                        until_step=warm_steps + 1, max_seconds=240)

    # the demonstrations first, each epoch's in its own order, then the traffic
    ids = [tid for step in first.ledger[:warm_steps] for tid in step]
    assert all(tid.startswith("warm:") for tid in ids) and len(ids) == 2 * len(DEMOS)
    epochs = [ids[k:k + len(DEMOS)] for k in range(0, len(ids), len(DEMOS))]
    assert all(sorted(e) == sorted(epochs[0]) for e in epochs) and epochs[0] != epochs[1]
    assert sorted(first.ledger[warm_steps]) == sorted(t["transition_id"] for t in traffic)
    # the warm start's own rate, then the learner's again for the traffic
    assert [g["lr"] for g in first.policy.optimizer.param_groups] == [1e-4] * len(
        first.policy.optimizer.param_groups)
    # version 1 is the warm start alone, registered before any traffic was trained
    client = MlflowClient(mlflow_server.uri)
    v1 = client.get_model_version(model, "1")
    assert v1.tags["step"] == str(warm_steps) and v1.tags["policy_version"] == "1"

    # it learnt the demonstrations: each is far likelier than under the base model
    policy = first.policy.model
    policy.eval()
    base_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    for t in warm_start.transitions(path, first.policy.tokenizer):
        learnt, before = _completion_logprob(policy, t), _completion_logprob(base_model, t)
        assert learnt > before + 10.0, (learnt, before)

    # a restart resumes from the registered checkpoint and does not warm start again
    produce(settings, [make_transition(9, ret=1.0)])
    second = run_learner(settings, experiment=f"warm-{mode}", model_name=model,
                         until_step=warm_steps + 2, max_seconds=240)
    assert second.resumed_from is not None
    again = [tid for step in second.ledger for tid in step if tid.startswith("warm:")]
    assert sorted(again) == sorted(ids)  # the first run's, kept in the ledger: none retrained
    assert second.policy.step == warm_steps + 2
