"""One learner per experiment, by Kafka's fencing of transactional producers; and a checkpoint's
consumed offsets committed in one transaction with its announcement.

    fence = Fence(settings, experiment, model_name)     # fences every earlier learner of it
    version = fence.commit(offsets, group, register, announce, unregister)

Every learner of an experiment uses the same `transactional.id`; `init_transactions` gives the
newest one a higher producer epoch, and from then on the broker refuses every transactional
request of the older ones. A checkpoint is registered inside a transaction: it begins by adding
the consumed offsets to it (the broker's answer is the fence check: a fenced learner stops
there, having registered nothing), then `register()` creates the MLflow version, the
announcement is produced and the transaction committed. A learner fenced between its check and
its commit (the newer one started within that second) deletes the version it just registered
(`unregister`) before it stops, so the newer one's versions are the only ones that stay.
Broker errors that are not fatal (an outage) are retried until the broker answers; the
offsets alone are given up after OFFSETS_PATIENCE_S (the checkpoint holds them).

A producer that wedges is replaced by a new one with the same `transactional.id`. librdkafka
2.16 can keep a stale group or transaction coordinator after a broker restart
(confluentinc/librdkafka#5511, open): `send_offsets_to_transaction` then blocks past its own
timeout, or `abort_transaction` times out on every retry, for good. So every transactional
call runs under a watchdog of WEDGED_AFTER_S, and an abort still timing out that long while
the broker answers counts as wedged too. The new producer's `init_transactions` aborts the open
transaction on the coordinator, and fences whoever holds the id: so it is made only when
`newer_learner()` says no learner started on the experiment since this one; otherwise this
learner stops as fenced. The wedged producer is left alone, not closed: a thread is still
blocked inside it, and the new producer's epoch has fenced it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from learner.batches import split_key
from learner.errors import LearnerError, LearnerFenced
from tracetrain.settings import Settings

log = logging.getLogger("tracetrain.learner")
T = TypeVar("T")
FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
LONGEST_WAIT_S = 30.0


# The consumer's group membership is not current (it lapsed in a broker outage, or a rebalance
# is under way): the broker takes no offsets from it until it polls again, which it does not
# do while it waits here; or the group's coordinator has not answered for OFFSETS_PATIENCE_S
# after an outage. Either way the checkpoint is registered without the group's offsets.
OFFSETS_PATIENCE_S = 60.0
# Past transaction.timeout.ms (60 s): by then the coordinator has aborted the transaction by
# itself, so a new producer finds nothing of it in flight.
WEDGED_AFTER_S = 90.0
_GO_ON_WITHOUT_OFFSETS = {KafkaError._TIMED_OUT, KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION,
                 KafkaError.REBALANCE_IN_PROGRESS, KafkaError.FENCED_INSTANCE_ID}


class _Abort(Exception):
    """The transaction must be aborted (librdkafka's txn_requires_abort)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


class _Wedged(Exception):
    """The producer is stuck (see the module docstring): replace it."""


class Fence:
    def __init__(self, settings: Settings, experiment: str, model_name: str,
                 newer_learner: Callable[[], bool] = lambda: False,
                 wedged_after_s: float = WEDGED_AFTER_S):
        self.transactional_id = f"{settings.topics.prefix}.learner.{model_name}.{experiment}"
        self._config = {
            "bootstrap.servers": settings.kafka.bootstrap_servers,
            "transactional.id": self.transactional_id, "acks": "all",
            # a transaction left open by a killed learner is aborted after this
            "transaction.timeout.ms": 60_000,
        }
        self.newer_learner = newer_learner
        self.wedged_after_s = wedged_after_s
        self.wedged: list[Producer] = []  # replaced ones, kept referenced (see the docstring)
        self.producer = self._new_producer()

    def commit(self, offsets: dict[str, int], group: Callable[[], object],
               register: Callable[[], T],
               announce: Callable[[T], tuple[str, bytes, bytes]],
               unregister: Callable[[T], None]) -> T:
        """Register a checkpoint as the experiment's one learner; see the module docstring.
        `offsets`: "topic:partition" -> next offset; `group()`: the consumer's group metadata
        now (a rebalance changes it); `announce(registered)`: (topic, key, value) of the
        announcement."""
        parts = [TopicPartition(*split_key(k), v) for k, v in offsets.items()]
        while True:
            try:
                self._call(self.producer.begin_transaction, "begin_transaction")
                if parts:
                    self._call(lambda parts=parts: self.producer.send_offsets_to_transaction(
                        parts, group(), 30), "send_offsets_to_transaction",
                        give_up_after_s=OFFSETS_PATIENCE_S)
                break
            except _Wedged as exc:
                self._replace(exc)
            except _Abort as exc:
                self._abort()
                if exc.code in _GO_ON_WITHOUT_OFFSETS:
                    # Go on without them: the checkpoint holds these offsets (a resumed
                    # learner seeks to them) and the next checkpoint commits newer ones; the
                    # fence still holds, the announcement and commit are transactional.
                    log.warning("%s; registering without committing the group's offsets", exc)
                    parts = []
                    continue
                log.warning("%s; aborting the transaction and trying again", exc)
                time.sleep(1.0)
        registered = register()
        topic, key, value = announce(registered)
        try:
            self.producer.produce(topic, key=key, value=value)
            self._call(lambda: self.producer.commit_transaction(30), "commit_transaction")
        except LearnerFenced:
            unregister(registered)
            raise
        except (_Abort, _Wedged) as exc:
            # Registered, its offsets not committed: harmless, a resumed learner seeks to the
            # offsets stored in the checkpoint; the next checkpoint commits newer ones.
            log.warning("checkpoint registered, but its offsets and announcement were not "
                        "committed (%s); the next checkpoint's are", exc)
            if isinstance(exc, _Wedged):
                self._replace(exc)
            else:
                self._abort()
        return registered

    def _abort(self) -> None:
        """abort_transaction through an outage; one still timing out `wedged_after_s` after it
        began while the broker answers has wedged the producer, which is replaced."""
        started = time.monotonic()

        def wedged() -> bool:
            return time.monotonic() - started > self.wedged_after_s and self._broker_answers()

        try:
            self._call(lambda: self.producer.abort_transaction(30), "abort_transaction",
                       give_up_when=wedged)
        except _Wedged as exc:
            self._replace(exc)

    def _replace(self, why: _Wedged) -> None:
        if self.newer_learner():
            raise LearnerFenced(
                f"another learner started on this experiment (transactional.id "
                f"{self.transactional_id!r}) while this one's producer was stuck ({why}): "
                f"this one stops") from why
        log.warning("%s; replacing the producer (transactional.id %r)", why,
                    self.transactional_id)
        self.wedged.append(self.producer)
        self.producer = self._new_producer()

    def _new_producer(self) -> Producer:
        while True:
            producer = Producer(self._config)
            try:
                self._call(lambda p=producer: p.init_transactions(30), "init_transactions")
                return producer
            except _Wedged as exc:
                log.warning("%s; trying a new producer", exc)
                self.wedged.append(producer)

    def _broker_answers(self) -> bool:
        try:
            self._bounded(lambda: self.producer.list_topics(timeout=5), "list_topics")
            return True
        except (KafkaException, _Wedged):
            return False

    def _bounded(self, fn: Callable[[], T], what: str) -> T:
        """fn(), or _Wedged when it has not returned in `wedged_after_s` (it blocks in
        librdkafka past its own timeout: see the module docstring)."""
        outcome: dict = {}
        done = threading.Event()

        def run():
            try:
                outcome["value"] = fn()
            except BaseException as exc:  # handed to the caller's thread
                outcome["error"] = exc
            finally:
                done.set()

        threading.Thread(target=run, name=f"fence-{what}", daemon=True).start()
        if not done.wait(self.wedged_after_s):
            raise _Wedged(f"{what} has not returned in {self.wedged_after_s:.0f} s")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def _call(self, fn: Callable[[], T], what: str, give_up_after_s: float | None = None,
              give_up_when: Callable[[], bool] = lambda: False) -> T:
        """Retry `fn` (under the watchdog) through errors that are not fatal; with
        `give_up_after_s`, a retriable error still there after that long is an _Abort (the
        caller goes on without it); when `give_up_when()` holds after a retriable error,
        _Wedged."""
        wait_s, started = 1.0, time.monotonic()
        while True:
            try:
                return self._bounded(fn, what)
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.code() in FENCED:
                    raise LearnerFenced(
                        f"another learner started on this experiment (transactional.id "
                        f"{self.transactional_id!r}): this one stops without registering "
                        f"({what}: {error})") from exc
                if error.fatal():
                    raise LearnerError(f"{what} failed for good: {error}") from exc
                if error.txn_requires_abort():
                    raise _Abort(f"{what}: {error}", error.code()) from exc
                if not error.retriable():
                    raise LearnerError(f"{what} failed: {error}") from exc
                if give_up_after_s is not None and time.monotonic() - started > give_up_after_s:
                    raise _Abort(f"{what}: {error}, for {give_up_after_s:.0f} s",
                                 KafkaError._TIMED_OUT) from exc
                if give_up_when():
                    raise _Wedged(f"{what}: {error}, while the broker answers") from exc
                log.warning("%s: %s; trying again in %.0f s", what, error, wait_s)
                time.sleep(wait_s)
                wait_s = min(wait_s * 2, LONGEST_WAIT_S)
