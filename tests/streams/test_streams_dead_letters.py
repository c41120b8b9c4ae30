"""A dead letter from the streams worker and one from the learner carry the same headers: the
one contract of `tracetrain.deadletter`, read back from the real broker."""

from __future__ import annotations

import pytest

from learner.batches import TransitionBatcher
from testkit.streams import consume, produce
from tracetrain.deadletter import HEADER_NAMES, read_dead_letter_headers


@pytest.mark.integration
def test_streams_and_learner_dead_letters_carry_identical_headers(streams_settings, workers):
    workers(streams_settings)
    produce(streams_settings, [], raw=[("spans", "bad-span", b"garbage"),
                                       ("transitions", "bad-transition", b"junk-bytes")])
    batcher = TransitionBatcher(streams_settings)
    try:
        batcher.next_batch(current_version=0, timeout_s=2.0, first_wait_s=60)
    finally:
        batcher.close()
    dlq = consume(streams_settings, "dlq", lambda r: len(r) >= 2, timeout_s=60)
    by_key = {key: headers for key, _, headers in dlq}
    assert set(by_key) == {b"bad-span", b"bad-transition"}, [key for key, _, _ in dlq]
    assert list(by_key[b"bad-span"]) == list(by_key[b"bad-transition"]) == list(HEADER_NAMES)
    from_streams = read_dead_letter_headers(by_key[b"bad-span"])
    from_learner = read_dead_letter_headers(by_key[b"bad-transition"])
    assert from_streams["source_topic"] == streams_settings.topics.spans
    assert from_learner["source_topic"] == streams_settings.topics.transitions
    for letter in (from_streams, from_learner):
        assert letter["offset"] == 0 and letter["partition"] >= 0
        assert letter["reason"] and letter["detail"]
