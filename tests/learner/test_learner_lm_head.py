"""learner/lm_head.py gives what TRL's fused LM head gives (values and gradients), on CPU."""

from __future__ import annotations

import pytest
import torch

from learner import lm_head
from learner.errors import LearnerError

OUTPUTS = ("entropy", "is_top1", "mean_logits")


def _patched_model(tiny_model_dir):
    from transformers import LlamaForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    model = LlamaForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", *OUTPUTS))
    return model


def _batch():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(10, 4000, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding of a short prompt
    mask[2, -3:] = 0  # right padding of a short response
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :6] = -100  # the prompt is not scored
    return ids, mask, labels


def _run(forward, model, ids, mask, labels):
    model.zero_grad(set_to_none=True)
    out = forward(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True,
                  num_items_in_batch=torch.tensor(7.0))
    # A loss that reaches both differentiable outputs, as TRL's entropy bonus does.
    (out.loss + 0.3 * out.entropy.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


def test_compact_cpu_head_matches_trl_values_and_gradients(tiny_model_dir):
    model = _patched_model(tiny_model_dir)
    trl_forward = model.forward
    assert lm_head.install(model, outputs=OUTPUTS, temperature=0.7, entropy_requires_grad=True)
    ids, mask, labels = _batch()
    ref, ref_grads = _run(trl_forward, model, ids, mask, labels)
    ours, our_grads = _run(model.forward, model, ids, mask, labels)

    assert ours.log_probs.shape == ref.log_probs.shape == (3, 11)
    torch.testing.assert_close(ours.loss, ref.loss, atol=1e-5, rtol=1e-5)
    for field in ("log_probs", "entropy", "mean_logits"):
        torch.testing.assert_close(getattr(ours, field), getattr(ref, field), atol=1e-5,
                                   rtol=1e-5)
    assert torch.equal(ours.is_top1, ref.is_top1)
    assert torch.equal(ours.label_mask, ref.label_mask)
    assert (ours.log_probs[~ours.label_mask] == 0).all()  # zero where the label is -100
    assert ref_grads.keys() == our_grads.keys() and ref_grads
    for name, grad in ref_grads.items():
        torch.testing.assert_close(our_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_entropy_carries_no_gradient_unless_asked(tiny_model_dir):
    model = _patched_model(tiny_model_dir)
    lm_head.install(model, outputs=("entropy",), temperature=0.7)
    ids, mask, labels = _batch()
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    assert out.log_probs.requires_grad and not out.entropy.requires_grad
    assert out.is_top1 is None and out.mean_logits is None  # not asked for: not computed


def test_models_it_cannot_score_keep_trl_and_misuse_is_named(tiny_model_dir):
    from transformers import LlamaForCausalLM

    plain = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    with pytest.raises(LearnerError, match="install after the TRL trainer is built"):
        lm_head.install(plain)
    model = _patched_model(tiny_model_dir)
    with pytest.raises(LearnerError, match=r"\['top_k'\]"):
        lm_head.install(model, outputs=("top_k",))
    model.config.final_logit_softcapping = 30.0  # a transform TRL's forward applies itself
    before = model.forward
    assert lm_head.install(model) is False and model.forward == before
