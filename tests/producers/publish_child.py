"""A producing process for the kill -9 test, run as a child by test_producers_outage.py.

    python tests/producers/publish_child.py '{"bootstrap":..., "prefix":..., "spool":..., "n":5000,
                                              "mode": "publish" | "drain"}'

publish: publishes n spans (20 rollouts, `seq` attribute), prints PROGRESS k every 250 and PUBLISHED n, then waits to be
killed. drain: opens the same spool (replaying what the killed one left), flushes, prints DRAINED.
"""

import json
import sys
import time

from producers.publisher import Publisher
from producers.records import new_span
from tracetrain.settings import load_settings
from tracetrain.settings.infra import KafkaSettings, TopicSettings

args = json.loads(sys.argv[1])
settings = load_settings().model_copy(update={
    "kafka": KafkaSettings(bootstrap_servers=args["bootstrap"]),
    "topics": TopicSettings(prefix=args["prefix"], partitions=4),
})
pub = Publisher(settings, name="child", spool_dir=args["spool"])
if args["mode"] == "publish":
    for i in range(args["n"]):
        pub.publish_span(new_span("llm", f"r{i % 20}", attributes={"seq": str(i)}))
        if (i + 1) % 250 == 0:
            print(f"PROGRESS {i + 1}", flush=True)  # these many publish calls have returned
    print(f"PUBLISHED {args['n']}", flush=True)
    time.sleep(600)
else:
    left = pub.close(timeout_s=120)
    print(f"DRAINED left={left} counts={pub.counts}", flush=True)
