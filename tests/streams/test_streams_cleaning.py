"""Trace cleaning: model / policy / agent selection and calls without token ids."""

from __future__ import annotations

import pytest

from streams.cleaning import NO_TOKEN_IDS, Selector
from streams.errors import StreamsError
from tracetrain.settings.streams import StreamsSettings


def span(agent="Writer", model="smollm2", policy="sql-policy", kind="llm", tokens=True):
    ids = [1, 2] if tokens else []
    return {"kind": kind, "agent_name": agent, "policy_name": policy,
            "llm": None if kind != "llm" else {"model": model, "prompt_token_ids": ids,
                                                "response_token_ids": ids}}


def test_three_agents_two_trained():
    sel = Selector.from_settings(StreamsSettings(select_agents="Writer|Rewriter"))
    assert sel.classify(span("Writer")) == "keep"
    assert sel.classify(span("Rewriter")) == "keep"
    assert sel.classify(span("Checker")) == "skip"
    assert sel.classify(span("WriterX")) == "skip"  # whole-name match


def test_model_policy_kind_and_token_ids():
    sel = Selector.from_settings(StreamsSettings(select_models="smollm2.*", select_policies="sql-.*"))
    assert sel.classify(span(model="gpt-4o")) == "skip"
    assert sel.classify(span(policy="other")) == "skip"
    assert sel.classify(span(policy=None)) == "keep"
    assert sel.classify(span(kind="tool")) == "skip"
    assert sel.classify(span(tokens=False)) == NO_TOKEN_IDS == "no token ids"


def test_bad_regex_is_named():
    with pytest.raises(StreamsError, match="SELECT_AGENTS '\\(Writer'"):
        Selector.from_settings(StreamsSettings(select_agents="(Writer"))
