"""The batcher thread: takes every waiting request (up to `max_batch`) into one decode, and
applies pending checkpoint swaps only between batches.

That is the whole atomicity argument: a batch runs start to end on one set of weights, so an
in-flight request finishes on the version it started on and carries that version; the next
batch runs on the new one. Nobody else touches the model.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future

from serving.engine.decode import GenRequest, GenResult, generate
from serving.engine.policy import Policy, Swap
from serving.errors import LoadError

log = logging.getLogger("tracetrain.engine")


class Batcher:
    def __init__(self, policy: Policy, max_batch: int = 8, batch_wait_s: float = 0.005):
        self.policy = policy
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self._requests: queue.Queue[tuple[GenRequest, Future]] = queue.Queue()
        self._swaps: queue.Queue[tuple[Swap, Future]] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="batcher", daemon=True)
        self.batches = 0
        self.batch_sizes: list[int] = []

    def start(self) -> Batcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._requests.put((None, None))  # wake the thread
        self._thread.join(timeout=30)

    def submit(self, request: GenRequest) -> Future:
        future: Future = Future()
        self._requests.put((request, future))
        return future

    def submit_swap(self, swap: Swap) -> Future:
        """Resolves to the new policy_version once the swap is serving (or to LoadError)."""
        future: Future = Future()
        self._swaps.put((swap, future))
        self._requests.put((None, None))  # wake an idle batcher so the swap happens now
        return future

    def _apply_swaps(self) -> None:
        while True:
            try:
                swap, future = self._swaps.get_nowait()
            except queue.Empty:
                return
            try:
                self.policy.apply(swap)
                future.set_result(self.policy.policy_version)
            except LoadError as exc:
                log.error("swap to %s failed, version %d keeps serving: %s",
                          swap.path, self.policy.policy_version, exc)
                future.set_exception(exc)

    def _take_batch(self) -> list[tuple[GenRequest, Future]]:
        batch = []
        try:
            first = self._requests.get(timeout=0.5)
        except queue.Empty:
            return batch
        if first[0] is not None:
            batch.append(first)
        deadline = time.monotonic() + self.batch_wait_s
        while len(batch) < self.max_batch:
            try:
                item = self._requests.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if item[0] is not None:
                batch.append(item)
        return batch

    def _run(self) -> None:
        while not self._stop.is_set():
            self._apply_swaps()
            batch = self._take_batch()
            self._apply_swaps()  # a swap that arrived while we waited goes first
            if not batch:
                continue
            version = self.policy.policy_version
            for req, _ in batch:
                req.policy_version = version
            try:
                results = generate(self.policy.model, self.policy.tokenizer,
                                   [req for req, _ in batch], self.policy.pad_id,
                                   self.policy.eos_ids)
            except Exception as exc:  # a decode failure must fail its requests, not the thread
                log.exception("decode of a batch of %d failed", len(batch))
                for _, future in batch:
                    future.set_exception(exc)
                continue
            self.batches += 1
            self.batch_sizes.append(len(batch))
            for (_, future), result in zip(batch, results, strict=True):
                result.policy_version = version
                future.set_result(result)


__all__ = ["Batcher", "GenRequest", "GenResult"]
