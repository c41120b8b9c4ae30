"""Codec throughput: ours (single-object encoding) versus bare fastavro, same records, same run.

    python -m bench.codec [--records 2000] [--rounds 5]

A realistic Span: about 600 prompt tokens, 200 response tokens with logprobs. Bare fastavro is
`schemaless_writer`/`schemaless_reader` with the parsed schema and a BytesIO, which is the
least any Avro encoder must do; ours adds the 10-byte header, the fingerprint lookup and the
error wrapping, and names the record branch of the Span's unions for fastavro (which otherwise
finds it by validating the whole LlmCall against it: schemas/unions.py). Chunks of 100 records alternate ours and bare so machine noise hits both,
and the median per-chunk ratio is reported. Prints one JSON line last: encode_ratio and
decode_ratio (ours / bare; above 1 means ours is faster).
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import time

from fastavro import schemaless_reader, schemaless_writer

from schemas import Codec
from testkit.records import span


def _bare_encode(parsed, records):
    out = []
    for record in records:
        buf = io.BytesIO()
        schemaless_writer(buf, parsed, record)
        out.append(buf.getvalue())
    return out


def _bare_decode(parsed, blobs):
    return [schemaless_reader(io.BytesIO(blob), parsed, None) for blob in blobs]


def _ours_encode(codec, records):
    return [codec.encode("Span", r) for r in records]


def _ours_decode(codec, blobs):
    return [codec.decode(b, "Span") for b in blobs]


def _seconds(fn, *args):
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(1)
    records = [span(rng) for _ in range(args.records)]
    codec = Codec()
    parsed = codec.history.current("Span").parsed
    ours_blobs = [codec.encode("Span", r) for r in records]
    bare_blobs = _bare_encode(parsed, records)
    n = len(records)
    # Interleave small chunks of ours and bare: load from other processes then hits both
    # sides alike, and the median of per-chunk ratios shrugs off the odd stalled chunk.
    chunk = 100
    ratios = {"enc": [], "dec": []}
    totals = {"ours_enc": 0.0, "bare_enc": 0.0, "ours_dec": 0.0, "bare_dec": 0.0}
    for _ in range(args.rounds):
        for i in range(0, n, chunk):
            recs, ours_b, bare_b = records[i:i + chunk], ours_blobs[i:i + chunk], bare_blobs[i:i + chunk]
            t = {
                "bare_enc": _seconds(_bare_encode, parsed, recs),
                "ours_enc": _seconds(_ours_encode, codec, recs),
                "bare_dec": _seconds(_bare_decode, parsed, bare_b),
                "ours_dec": _seconds(_ours_decode, codec, ours_b),
            }
            for key, value in t.items():
                totals[key] += value
            ratios["enc"].append(t["bare_enc"] / t["ours_enc"])
            ratios["dec"].append(t["bare_dec"] / t["ours_dec"])
    done = n * args.rounds
    best = {k: done / v for k, v in totals.items()}
    result = {
        "bench": "codec",
        "records": n,
        "bytes_per_record": round(sum(map(len, ours_blobs)) / n),
        "encode_per_s": round(best["ours_enc"]),
        "decode_per_s": round(best["ours_dec"]),
        "bare_encode_per_s": round(best["bare_enc"]),
        "bare_decode_per_s": round(best["bare_dec"]),
        "encode_ratio": round(statistics.median(ratios["enc"]), 3),
        "decode_ratio": round(statistics.median(ratios["dec"]), 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
