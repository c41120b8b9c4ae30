"""Publisher throughput: ours (codec + write-ahead spool + delivery tracking) versus bare
confluent-kafka with bare fastavro, same records, same producer settings, same broker.

    .venv/bin/python -m bench.producer [--spans 8000] [--rounds 10]

Starts its own Kafka broker (free ports, temporary state folder) and fresh topics per run;
each round runs every side, rotating which goes first (the load of a shared machine drifts).
A third side, bare confluent-kafka fed by our codec, splits the figure in two: our codec
against bare fastavro (our codec names union branches, schemas/unions.py), and the
publisher's own cost (spool, delivery tracking) against a bare producer.
Prints the figures last as one JSON line: ratio (the median over rounds of ours / bare spans
per second, with its quartiles), ratio_publisher_only (ours / bare fed by our codec),
spans_per_s and mb_per_s (ours, medians), the bare figures, and encode_us / bare_encode_us
(microseconds to encode one span, measured without Kafka).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
import uuid
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from confluent_kafka import Producer
from fastavro import parse_schema, schemaless_writer

from infra import processes, topics
from infra.kafka import broker
from producers.publisher import Publisher, producer_config
from producers.records import llm_part, new_span
from schemas import Codec
from tracetrain.settings import Settings, load_settings
from tracetrain.settings.infra import KafkaSettings, TopicSettings


@contextmanager
def temp_broker():
    """A broker of its own for a benchmark: yields Settings pointing at it; stopped after."""
    home = Path(tempfile.mkdtemp(prefix="tt-bench-"))
    kafka = KafkaSettings(port=processes.free_port(), controller_port=processes.free_port(),
                          heap_mb=512)
    broker.start(home, kafka, brokers=1)
    kafka = kafka.model_copy(update={"bootstrap_servers": broker.bootstrap(kafka, 1)})
    try:
        yield load_settings().model_copy(update={"kafka": kafka, "home": home})
    finally:
        broker.stop(home)


def with_topics(settings: Settings) -> Settings:
    t = TopicSettings(prefix=f"bench-{uuid.uuid4().hex[:8]}", partitions=4)
    topics.create_topics(settings.kafka.bootstrap_servers, t)
    return settings.model_copy(update={"topics": t})


def sample_spans(n: int) -> list[dict]:
    """LLM spans of a realistic size: ~200 prompt and ~60 response tokens with logprobs."""
    out = []
    for i in range(n):
        out.append(new_span("llm", f"ro-{i % 500}", task_id=f"t-{i % 50}", agent_name="bench",
                            llm=llm_part("smollm2", policy_version=3,
                                         request_messages=json.dumps([{"role": "user",
                                                                       "content": "x" * 400}]),
                                         response_text="y" * 200,
                                         prompt_token_ids=list(range(200)),
                                         response_token_ids=list(range(60)),
                                         response_logprobs=[-0.5] * 60, finish_reason="stop",
                                         prompt_tokens=200, completion_tokens=60)))
    return out


def bare_encoder(codec: Codec):
    """Bare fastavro, as a user of the library would write a single-object message."""
    schema = codec.history.current("Span")
    parsed, header = parse_schema(schema.raw), schema.header

    def encode(span: dict) -> bytes:
        buf = io.BytesIO()
        buf.write(header)
        schemaless_writer(buf, parsed, span)
        return buf.getvalue()

    return encode


def run_bare(settings: Settings, spans: list[dict], encode) -> tuple[float, int]:
    producer = Producer(producer_config(settings))
    topic, nbytes = settings.topics.spans, 0
    t0 = time.perf_counter()
    for span in spans:
        value = encode(span)
        nbytes += len(value)
        while True:
            try:
                producer.produce(topic, value, span["rollout_id"].encode())
                break
            except BufferError:
                producer.poll(0.01)
        # No per-message poll: no delivery callbacks are registered, so this is the fastest
        # bare use (and it does none of our bookkeeping).
    left = producer.flush(120)
    elapsed = time.perf_counter() - t0
    assert left == 0, f"bare producer left {left} undelivered"
    return elapsed, nbytes


def encode_us(encode, spans: list[dict], repeats: int = 5) -> float:
    """Median over `repeats` passes of the microseconds `encode` takes per span."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for span in spans:
            encode(span)
        times.append((time.perf_counter() - t0) / len(spans) * 1e6)
    return statistics.median(times)


def run_ours(settings: Settings, spans: list[dict], spool: Path) -> tuple[float, int]:
    pub = Publisher(settings, name="bench", spool_dir=spool)
    codec = pub.codec
    nbytes = sum(len(codec.encode("Span", s)) for s in spans[:100]) * len(spans) // 100
    t0 = time.perf_counter()
    for span in spans:
        pub.publish_span(span)
    left = pub.flush(120)
    elapsed = time.perf_counter() - t0
    pub.close(10)
    assert left == 0, f"publisher left {left} undelivered"
    return elapsed, nbytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    spans = sample_spans(args.spans)
    codec = Codec()
    bare_encode, our_encode = bare_encoder(codec), partial(codec.encode, "Span")
    assert bare_encode(spans[0]) == our_encode(spans[0]), "the two encoders must write the same bytes"
    encode_figures = {"encode_us": round(encode_us(our_encode, spans[:1000]), 1),
                      "bare_encode_us": round(encode_us(bare_encode, spans[:1000]), 1)}
    rates: dict[str, list[float]] = {"bare": [], "bare_our_codec": [], "ours": []}
    mbs = []
    with temp_broker() as base:
        run_bare(with_topics(base), spans[:2000], bare_encode)  # warm-up: connections, metadata
        sides = list(rates)
        for r in range(args.rounds):
            # Rotate which side goes first: on a shared machine the load drifts.
            for side in sides[r % 3:] + sides[:r % 3]:
                if side == "ours":
                    secs, nbytes = run_ours(with_topics(base), spans,
                                            base.home_dir / f"spool-{r}")
                    mbs.append(nbytes / secs / 1e6)
                else:
                    encode = bare_encode if side == "bare" else our_encode
                    secs, _ = run_bare(with_topics(base), spans, encode)
                rates[side].append(len(spans) / secs)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rates.items())
                  + " spans/s")
    # Each round's ratio compares runs seconds apart, so a slow spell of the shared machine
    # hits both sides of it; the median of those is steadier than a ratio of medians.
    ours, bare = rates["ours"], rates["bare"]
    ratios = sorted(o / b for o, b in zip(ours, bare, strict=True))
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    publisher_only = [o / b for o, b in zip(ours, rates["bare_our_codec"], strict=True)]
    result = {
        "ratio": round(statistics.median(ratios), 3),
        "ratio_q1": round(q1, 3), "ratio_q3": round(q3, 3),
        "ratio_of_medians": round(statistics.median(ours) / statistics.median(bare), 3),
        "ratio_publisher_only": round(statistics.median(publisher_only), 3),
        "spans_per_s": round(statistics.median(ours)),
        "mb_per_s": round(statistics.median(mbs), 2),
        "bare_spans_per_s": round(statistics.median(bare)),
        "bare_our_codec_spans_per_s": round(statistics.median(rates["bare_our_codec"])),
        **encode_figures,
        "spans": len(spans), "rounds": args.rounds,
        "avg_span_bytes": round(statistics.median(mbs) * 1e6 / statistics.median(ours)),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
