"""The demo's agent workers: threads that solve training problems through the gateway, as a
production agent would, while the tracer records the tool calls and publishes each final
reward (which closes the rollout in the streams).

Each training problem is solved `group_size` times under one task id, so the learner's
`group` advantages (GRPO) compare rollouts of the same problem. Training problems come from
`TRAIN_SEED` onwards, one seed per round, never from the held-out seed, and in the `train`
split's phrasings (calc's held-out scenarios and question forms never reach traffic).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

from demo.tasks import Task
from producers.publisher import Publisher
from producers.tracer import Tracer
from tracetrain.settings import Settings

TRAIN_SEED = 7
ROUND = 64  # problems generated at a time


@dataclass
class Episode:
    at: float  # wall time it ended
    reward: float
    worker: int


@dataclass
class TrafficStats:
    episodes: list[Episode] = field(default_factory=list)
    errors: int = 0
    last_error: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, episode: Episode) -> None:
        with self.lock:
            self.episodes.append(episode)

    def failed(self, exc: Exception) -> None:
        with self.lock:
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"

    def window(self, seconds: float, now: float | None = None) -> list[Episode]:
        now = now or time.time()
        with self.lock:
            return [e for e in self.episodes if now - e.at <= seconds]


class Traffic:
    def __init__(self, settings: Settings, task: Task, gateway_url: str, workers: int,
                 group_size: int, temperature: float, folder):
        self.settings, self.task, self.url = settings, task, gateway_url
        self.workers, self.group_size, self.temperature = workers, group_size, temperature
        self.folder = folder
        self.stats = TrafficStats()
        self.stop = threading.Event()
        self.publisher = Publisher(settings, name="demo-agents")
        self.tracer = Tracer(self.publisher, agent=task.name, service="tracetrain-demo")
        self._jobs = self._schedule()
        self._jobs_lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def _schedule(self):
        """(problem, task_id, seed) forever: each problem group_size times in a row."""
        for round_no in itertools.count():
            seed = TRAIN_SEED + round_no
            for i, problem in enumerate(self.task.problems(ROUND, seed, self.folder, split="train")):
                for attempt in range(self.group_size):
                    yield problem, f"train-{seed}-{i}", (seed * 1000 + i) * 16 + attempt

    def _next(self):
        with self._jobs_lock:
            return next(self._jobs)

    def _work(self, worker: int) -> None:
        agent = self.task.agent(self.url, self.tracer, temperature=self.temperature)
        while not self.stop.is_set():
            problem, task_id, seed = self._next()
            try:
                value = self.task.solve(agent, problem, task_id=task_id, seed=seed)
            except Exception as exc:  # an agent error must not end the demo; it is shown
                self.stats.failed(exc)
                self.stop.wait(1.0)
                continue
            self.stats.add(Episode(time.time(), value, worker))

    def start(self) -> None:
        for worker in range(self.workers):
            thread = threading.Thread(target=self._work, args=(worker,), daemon=True,
                                      name=f"demo-agent-{worker}")
            thread.start()
            self._threads.append(thread)

    def close(self, timeout_s: float = 60.0) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout_s)
        self.publisher.close()
