"""How far this worker has read each input partition, and what is left: the facts the close
rules and the stall check decide on. Plain Python: the Faust adapter (`streams/join.py`)
feeds it each record read and the end/committed offsets it asks the broker for.

Keys are (topic short name, partition): ("spans", 3).
"""

from __future__ import annotations

from collections.abc import Iterable

WATCHED = ("spans", "air")  # the streams a final reward waits for (see Rollout.close_reason)
INPUTS = ("spans", "rewards", "air")
# An assigned input partition with records left and none processed this long is resumed, and
# sought to its committed offset if it delivered nothing since its assignment: after a
# rebalance Faust can leave a partition out of its fetches for good (faust-streaming issue 629;
# seen here as a survivor's lag gauge stuck above 0 in test_two_workers_kill_one, for the
# partitions it took over; resuming alone did not end it there).
STALL_S = 15.0

Stream = tuple[str, int]


class ReadPositions:
    def __init__(self) -> None:
        self.watermark: dict[Stream, int] = {}  # highest record ts read, per stream
        self.last_offset: dict[Stream, int] = {}  # offset of the last record processed
        self.progressed: dict[Stream, float] = {}  # wall time of that record (or assignment)
        self.ends: dict[Stream, int] = {}  # end offsets, asked at `ends_at`
        # the group's committed offsets, asked for partitions not read since their assignment
        self.committed: dict[Stream, int] = {}
        self.ends_at = 0.0
        self._memo: dict[Stream, bool] | None = None

    def read(self, short: str, partition: int, offset: int, ts_ns: int, wall: float) -> None:
        """One record of `short`[partition] was processed."""
        stream = (short, partition)
        self.watermark[stream] = max(self.watermark.get(stream, 0), ts_ns)
        self.last_offset[stream] = offset
        self.progressed[stream] = wall

    # -- what is left to read ---------------------------------------------------------------

    def unread(self, short: str, partition: int) -> int | None:
        """Records of `short`[partition] not processed by this worker; None: not known yet."""
        end = self.ends.get((short, partition))
        if end is None:
            return None  # not asked yet
        done = self.last_offset.get((short, partition))
        if done is not None:
            return max(0, end - done - 1)
        if end == 0:
            return 0
        # Nothing processed here since this worker got the partition: caught up if the
        # group's committed offset (the next one to read) is at the end, as after a restart
        # or a takeover whose previous owner had read everything.
        committed = self.committed.get((short, partition))
        return None if committed is None else end - max(committed, 0)

    def lagging(self, short: str, partition: int) -> bool:
        """Are there records of `short`[partition] this worker has not processed yet?
        Memoised between `memoise` and `forget_memo` (a timer tick asks it for every open
        rollout)."""
        if self._memo is not None:
            stream = (short, partition)
            if stream not in self._memo:
                self._memo[stream] = self._lagging_now(short, partition)
            return self._memo[stream]
        return self._lagging_now(short, partition)

    def _lagging_now(self, short: str, partition: int) -> bool:
        unread = self.unread(short, partition)
        return unread is None or unread > 0

    def memoise(self) -> None:
        self._memo = {}

    def forget_memo(self) -> None:
        self._memo = None

    def read_past(self, partition: int, ts_ns: int) -> bool:
        """Every watched stream of `partition` read past `ts_ns` (strictly: many records share
        one millisecond timestamp)."""
        return all(self.watermark.get((s, partition), 0) > ts_ns for s in WATCHED)

    def drained(self, partition: int, since_wall: float = 0.0) -> bool:
        """End offsets asked no earlier than `since_wall`, and all watched records processed."""
        return self.ends_at >= since_wall and \
            not any(self.lagging(s, partition) for s in WATCHED)

    def behind(self, partition: int) -> bool:
        """Records of any input of `partition` left to read: its rollouts are behind, not idle."""
        return any(self.lagging(s, partition) for s in INPUTS)

    # -- the broker's offsets ----------------------------------------------------------------

    def unknown_committed(self, streams: Iterable[Stream]) -> list[Stream]:
        """Of `streams`, those neither read here nor with a committed offset known."""
        return [s for s in streams if s not in self.last_offset and s not in self.committed]

    def update(self, ends: dict[Stream, int], committed: dict[Stream, int],
               asked_wall: float) -> dict[Stream, int]:
        """Take the end offsets (asked at `asked_wall`) and committed offsets the broker gave;
        returns each stream's unread count (-1: unknown) for the lag gauge."""
        self.ends = dict(ends)
        self.committed.update(committed)
        self.ends_at = asked_wall
        return {s: -1 if (lag := self.unread(*s)) is None else lag for s in self.ends}

    # -- stalls --------------------------------------------------------------------------------

    def stalled(self, assigned: frozenset[int], now: float) -> list[Stream]:
        """Assigned input partitions with records left to read and none processed for STALL_S
        (each reported at most once per STALL_S)."""
        found = []
        for short in INPUTS:
            for p in assigned:
                since = self.progressed.setdefault((short, p), now)
                if now - since >= STALL_S and self.unread(short, p):
                    found.append((short, p))
                    self.progressed[(short, p)] = now
        return found

    def restart_offset(self, short: str, partition: int) -> int | None:
        """Where a stalled partition is read again from: the group's committed offset, for a
        partition that has delivered nothing since this worker got it (the stall seen after
        takeovers). None where records were processed (Faust's buffers may still hold the
        next ones: a seek would deliver them twice) or the committed offset is not known."""
        if (short, partition) in self.last_offset:
            return None
        committed = self.committed.get((short, partition))
        return None if committed is None else max(committed, 0)

    def clear(self) -> None:
        """Forget everything (partitions revoked): the next owner reads from the committed
        offset, which `unread` then asks for."""
        for table in (self.watermark, self.last_offset, self.progressed, self.committed):
            table.clear()
