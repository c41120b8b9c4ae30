"""Off-policy correction and per-rollout loss weighting of the `rl` step, against hand-computed
values on a tiny real model (no Kafka)."""

from __future__ import annotations

import math

import pytest
import torch

from learner.policy_loss import response_logps
from learner.trainer import PolicyTrainer
from testkit.learner import learner_settings, make_transition
from tracetrain.settings import load_settings


def _policy(tiny_model_dir, tmp_path, **learner):
    settings = learner_settings(load_settings(home=tmp_path), tiny_model_dir, **learner)
    return PolicyTrainer(settings, tmp_path / "work")


def _learner_logps(policy, batch):
    inputs = policy.inputs(batch, [0.0] * len(batch), [1.0] * len(batch))
    policy.model.train()
    logps = response_logps(policy.trl, policy.model, inputs)
    return [logps[i, : len(t["response_token_ids"])] for i, t in enumerate(batch)]


def test_truncated_is_ratios_truncation_and_clip_fraction_match_hand_values(tiny_model_dir, tmp_path):
    policy = _policy(tiny_model_dir, tmp_path, lr=1e-6, tis_cap=2.0, epsilon=0.2)
    batch = [make_transition(i, response=[410 + i, 411, 2]) for i in range(4)]
    # behaviour = learner - delta, so rho = exp(delta) per token.
    deltas = [0.5, 1.0, -0.1, -0.5]
    for t, lp, d in zip(batch, _learner_logps(policy, batch), deltas, strict=True):
        t["behaviour_logprobs"] = (lp - d).tolist()
    advantages = [1.0, -1.0, -1.0, -1.0]
    metrics = policy.train_step(batch, advantages, [1.0] * 4)
    rho = [math.exp(d) for d in deltas]
    assert metrics["is_ratio_mean"] == pytest.approx(sum(rho) / 4, rel=1e-4)
    assert metrics["is_ratio_max"] == pytest.approx(math.e, rel=1e-4)
    # Only row 1 (rho = e > 2) is truncated: 3 of 12 tokens.
    assert metrics["is_truncated_fraction"] == pytest.approx(0.25)
    # PPO clip (eps 0.2): row 0 (rho 1.65 > 1.2, A > 0) and row 3 (rho 0.61 < 0.8, A < 0).
    assert metrics["clip_fraction"] == pytest.approx(0.5)
    # GRPO loss, per-sequence mean of -min(r*A*w, clip(r)*A*w), w = min(rho, 2) / rho:
    # row 0: -1.2; row 1: A*w = -2/e, -min(-2, -1.2*2/e) = 2; row 2: 0.905; row 3: 0.8.
    expected = (-1.2 + 2.0 + math.exp(-0.1) + 0.8) / 4
    assert metrics["loss"] == pytest.approx(expected, rel=1e-4)


def test_without_tis_cap_the_mismatch_is_not_truncated(tiny_model_dir, tmp_path):
    policy = _policy(tiny_model_dir, tmp_path, lr=1e-6, epsilon=0.2)
    batch = [make_transition(1, response=[411, 411, 2])]
    (lp,) = _learner_logps(policy, batch)
    batch[0]["behaviour_logprobs"] = (lp - 1.0).tolist()
    metrics = policy.train_step(batch, [-1.0], [1.0])
    assert "is_truncated_fraction" not in metrics
    assert metrics["loss"] == pytest.approx(math.e, rel=1e-4)  # -min(-e, -1.2)


def test_learner_scores_at_the_transitions_sampling_temperature(tiny_model_dir, tmp_path):
    policy = _policy(tiny_model_dir, tmp_path)
    hot = make_transition(0, response=[410, 411, 2])
    hot["sampling_temperature"] = 0.5
    plain = dict(hot, sampling_temperature=None)
    (at_half,) = _learner_logps(policy, [hot])
    (at_one,) = _learner_logps(policy, [plain])
    # By hand: log_softmax(logits / 0.5) of the plain model's logits.
    ids = torch.tensor([hot["prompt_token_ids"] + hot["response_token_ids"]])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0, len(hot["prompt_token_ids"]) - 1: -1]
    targets = torch.tensor(hot["response_token_ids"]).unsqueeze(1)
    for temperature, got in ((0.5, at_half), (1.0, at_one)):
        want = (logits / temperature).log_softmax(-1).gather(1, targets).squeeze(1)
        assert torch.allclose(got, want, atol=1e-4), (temperature, got, want)
    assert not torch.allclose(at_half, at_one, atol=1e-2)


def test_greedy_calls_are_scored_at_temperature_one_never_divided_by_zero(tiny_model_dir,
                                                                          tmp_path):
    # Temperature 0 is greedy (both engines; vLLM below 1e-5): scored under the unscaled
    # distribution the engines report greedy logprobs of, and trainable (finite loss).
    policy = _policy(tiny_model_dir, tmp_path, lr=1e-6)
    plain = make_transition(0, response=[410, 411, 2])
    (at_one,) = _learner_logps(policy, [plain])
    for greedy in (0.0, 1e-7):
        (got,) = _learner_logps(policy, [dict(plain, sampling_temperature=greedy)])
        assert torch.allclose(got, at_one, atol=1e-5), (greedy, got, at_one)
    row = dict(plain, sampling_temperature=1e-7, behaviour_logprobs=at_one.tolist())
    assert math.isfinite(policy.train_step([row], [1.0], [1.0])["loss"])


@pytest.mark.parametrize("normalisation, expected", [("rollout", 0.0), ("call", -0.5)])
def test_loss_weighs_each_rollout_once(tiny_model_dir, tmp_path, normalisation, expected):
    # Rollout A: three calls at advantage +1; rollout B: one call at -1. On-policy (ratio 1) the
    # GRPO loss is the weighted mean of -A: per rollout (-1 + 1) / 2 = 0, per call -2 / 4.
    policy = _policy(tiny_model_dir, tmp_path, loss_normalisation=normalisation)
    batch = [make_transition(i) for i in range(4)]
    for t, rollout in zip(batch, "AAAB", strict=True):
        t["rollout_id"] = rollout
    metrics = policy.train_step(batch, [1.0, 1.0, 1.0, -1.0], [1.0] * 4)
    assert metrics["loss"] == pytest.approx(expected, abs=1e-5)


def _retokenized(i: int) -> dict:
    """A call the streams stage re-tokenised from an OpenTelemetry span: no behaviour logprobs."""
    return dict(make_transition(i, response=[410 + i, 411, 2]), retokenized=True)


def test_retokenised_rows_are_on_policy_and_leave_the_clip_and_is_metrics_alone(tiny_model_dir,
                                                                                tmp_path):
    policy = _policy(tiny_model_dir, tmp_path, lr=1e-6, tis_cap=2.0, epsilon=0.2)
    engine = [make_transition(i, response=[410 + i, 411, 2]) for i in range(2)]
    deltas = [0.5, 1.0]  # rho = exp(delta): row 0 clipped (A > 0), row 1 truncated
    for t, lp, d in zip(engine, _learner_logps(policy, engine), deltas, strict=True):
        t["behaviour_logprobs"] = (lp - d).tolist()
    alone = policy.train_step([dict(t) for t in engine], [1.0, -1.0], [1.0] * 2)
    policy = _policy(tiny_model_dir, tmp_path / "mixed", lr=1e-6, tis_cap=2.0, epsilon=0.2)
    mixed = policy.train_step([*engine, _retokenized(2), _retokenized(3)], [1.0, -1.0, 1.0, -1.0],
                              [1.0] * 4)
    # The clip and IS figures are those of the engine's rows, whatever rides along with them.
    for name in ("clip_fraction", "is_ratio_mean", "is_ratio_max", "is_truncated_fraction"):
        assert mixed[name] == pytest.approx(alone[name], rel=1e-4), name
    assert mixed["clip_fraction"] == pytest.approx(0.5)  # row 0's 3 tokens of the 6 measured
    assert mixed["is_truncated_fraction"] == pytest.approx(0.5)  # row 1's
    assert mixed["behaviour_token_fraction"] == pytest.approx(0.5) and mixed["retokenized"] == 2
    # Ratio 1 for the re-tokenised rows: -A each. Row 0: -1.2 (clipped), row 1: 2 (see above).
    assert mixed["loss"] == pytest.approx((-1.2 + 2.0 - 1.0 + 1.0) / 4, rel=1e-4)


def test_a_batch_of_retokenised_rows_trains_on_policy(tiny_model_dir, tmp_path):
    policy = _policy(tiny_model_dir, tmp_path, lr=5e-3, tis_cap=2.0)
    good, bad = _retokenized(0), _retokenized(1)
    before = policy.response_logprob_sums([good, bad])
    for _ in range(3):
        metrics = policy.train_step([good, bad], [1.0, -1.0], [1.0, 1.0])
        assert metrics["clip_fraction"] == 0.0 and metrics["behaviour_token_fraction"] == 0.0
        assert "is_ratio_mean" not in metrics  # nothing to correct: no engine logprobs
    after = policy.response_logprob_sums([good, bad])
    assert after[0] > before[0] and after[1] < before[1]


@pytest.mark.parametrize("mode", ["sft", "kto"])
def test_offline_modes_train_on_retokenised_rows_as_they_are(tiny_model_dir, tmp_path, mode):
    policy = _policy(tiny_model_dir, tmp_path, lr=5e-3, mode=mode, sft_min_reward=0.5)
    batch = [dict(_retokenized(i), credited_return=float(i % 2)) for i in range(4)]
    before = {k: v.clone() for k, v in policy.trainable_state().items()}
    metrics = policy.train_step(batch, [-1.0, 1.0, -1.0, 1.0], [1.0] * 4)
    assert math.isfinite(metrics["loss"]) and metrics["retokenized"] == 4
    moved = [k for k, v in policy.trainable_state().items() if not torch.equal(v, before[k])]
    assert moved, "the step changed no trainable weight"
