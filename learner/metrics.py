"""The learner's Prometheus metrics and typed state, served by `tracetrain learner` on
`learner.metrics_host:metrics_port` (/metrics, /healthz, /state: tracetrain.observability).

    metrics = LearnerMetrics()
    with serve_status(settings.learner, metrics):
        run_learner(settings, metrics=metrics)

The per-step figures (loss, reward, KL, ...) also go to the learner's MLflow run; these are the
live ones a dashboard or an operator reads while it trains."""

from __future__ import annotations

from collections import Counter

from prometheus_client.core import CounterMetricFamily

from tracetrain.observability import Metrics, StatusServer, metric_name, values
from tracetrain.settings.learner import LearnerSettings


class LearnerMetrics:
    def __init__(self) -> None:
        m = self.metrics = Metrics("learner")
        self.steps = m.counter("trained", "steps", "Training steps taken.")
        self.transitions = m.counter("trained", "transitions", "Transitions trained on.")
        self.checkpoints = m.counter("registered", "checkpoints",
                                     "Checkpoints registered in MLflow (offsets committed after).")
        self.skipped = m.counter("skipped", "steps", "Steps not taken: their loss or gradient "
                                 "was not finite (their transitions went to the DLQ).", ["reason"])
        self.rejected = m.counter("rejected", "checkpoints", "Checkpoints not registered: the "
                                  "policy's probe loss was not finite (it went back to the last "
                                  "registered one).")
        self.policy_version = m.gauge("policy", "version", "policy_version of the newest "
                                      "checkpoint (resumed or registered).")
        self.loss = m.gauge("last_loss", "value", "Loss of the last step.")
        self.reward = m.gauge("batch_mean_reward", "value", "Mean reward of the last step's batch.")
        self.staleness = m.gauge("batch_staleness", "versions",
                                 "Mean versions behind of the last step's batch.")
        self.step_seconds = m.histogram("step_duration", "seconds", "Wall time of a training step.",
                                        buckets=(0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300))
        self._counters: Counter = Counter()  # the batcher's, once run_learner has one
        m.register(self)  # collect() below: the batcher's record counts at scrape time
        self.last_step: dict[str, float] = {}

    def watch(self, counters: Counter) -> None:
        """Export the batcher's record counts (consumed, accepted, duplicate, stale, dlq:...)."""
        self._counters = counters

    def collect(self):
        family = CounterMetricFamily(metric_name("learner", "input", "records"),
                                     "Transition records by outcome (consumed, accepted, "
                                     "duplicate, stale, dlq:<reason>, ...).", labels=["outcome"])
        for outcome, count in dict(self._counters).items():  # dict(): a copy, the batcher writes
            family.add_metric([outcome], count)
        yield family

    def stepped(self, transitions: int, step_metrics: dict, seconds: float) -> None:
        self.steps.inc()
        self.transitions.inc(transitions)
        self.step_seconds.observe(seconds)
        self.last_step = dict(step_metrics)
        for gauge, key in ((self.loss, "loss"), (self.reward, "mean_reward"),
                           (self.staleness, "staleness")):
            if key in step_metrics:
                gauge.set(step_metrics[key])

    def checkpointed(self, policy_version: int) -> None:
        self.checkpoints.inc()
        self.policy_version.set(policy_version)

    def state(self) -> dict:
        return {"trained_steps": int(values(self.steps)),
                "trained_transitions": int(values(self.transitions)),
                "registered_checkpoints": int(values(self.checkpoints)),
                "skipped_steps": values(self.skipped, "reason"),
                "rejected_checkpoints": int(values(self.rejected)),
                "policy_version": int(values(self.policy_version)),
                "last_step": self.last_step, "input_records": dict(self._counters)}


def serve_status(learner: LearnerSettings, metrics: LearnerMetrics) -> StatusServer:
    return StatusServer(metrics.metrics, metrics.state, learner.metrics_host, learner.metrics_port)
