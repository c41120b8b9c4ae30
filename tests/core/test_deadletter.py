"""The one DLQ contract: header names, order, round trip and what a reader makes of gaps."""

from __future__ import annotations

from tracetrain.deadletter import (
    HEADER_NAMES,
    MAX_DETAIL_CHARS,
    dead_letter_headers,
    read_dead_letter_headers,
)


def test_headers_round_trip_in_contract_order():
    headers = dead_letter_headers("t.spans", 3, 41, reason="bad_magic", detail="first byte 0x67")
    assert [name for name, _ in headers] == list(HEADER_NAMES)
    assert all(isinstance(value, bytes) for _, value in headers)
    assert read_dead_letter_headers(headers) == {
        "source_topic": "t.spans", "partition": 3, "offset": 41, "reason": "bad_magic",
        "detail": "first byte 0x67"}


def test_reader_takes_a_mapping_and_fills_missing_headers():
    letter = read_dead_letter_headers({"reason": b"late_event", "offset": b"-1", "other": b"x"})
    assert letter == {"source_topic": "", "partition": -1, "offset": -1, "reason": "late_event",
                      "detail": ""}
    assert read_dead_letter_headers(None)["reason"] == ""


def test_detail_is_cut_to_a_header_sized_message():
    headers = dict(dead_letter_headers("t.air", 0, 0, reason="r", detail="x" * 10_000))
    assert len(headers["detail"]) == MAX_DETAIL_CHARS
