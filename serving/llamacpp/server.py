"""One llama-server process: a base GGUF plus, optionally, one LoRA GGUF, on a loopback port.

It is the engine's child, not a stack service: it lives in the engine's process group (so
`tracetrain down`, which signals the engine's group, ends it too) and asks the kernel to end it
if the engine dies (PR_SET_PDEATHSIG), so a killed engine never leaves a server holding memory.
Its readiness wait and log tail are infra.processes' own.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
from pathlib import Path

import httpx

from infra import processes
from tracetrain.errors import InfraError, TracetrainError

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the process group still reaches it
        pass


class LlamaServerError(TracetrainError):
    """llama-server did not start or did not answer."""


class LlamaServer:
    """Start with `start()` (or `with`), stop with `stop()`. `url` is its base URL."""

    def __init__(self, binary: Path, model: Path, *, lora: Path | None = None, slots: int = 8,
                 context: int = 2048, threads: int | None = None, log: Path | None = None,
                 host: str = "127.0.0.1", start_timeout_s: float = 120.0,
                 extra_args: tuple[str, ...] = ()):
        self.binary, self.model, self.lora = Path(binary), Path(model), lora
        self.slots, self.context, self.threads = slots, context, threads
        self.host, self.port = host, processes.free_port(host)
        self.log = log
        self.start_timeout_s = start_timeout_s
        self.extra_args = extra_args
        self.proc: subprocess.Popen | None = None
        self.url = f"http://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        # Each of `slots` parallel sequences gets `context` tokens of KV cache; the server
        # batches all running slots into one decode step (continuous batching).
        args = [str(self.binary), "-m", str(self.model), "--host", self.host,
                "--port", str(self.port), "-np", str(self.slots),
                "-c", str(self.slots * self.context), "--no-webui", "--metrics"]
        if self.threads:
            args += ["-t", str(self.threads), "-tb", str(self.threads)]
        if self.lora is not None:
            args += ["--lora", str(self.lora)]
        return [*args, *self.extra_args]

    def start(self) -> LlamaServer:
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        finally:
            if self.log:
                out.close()
        try:
            processes.wait_until(self.healthy, self.start_timeout_s,
                                 f"llama-server on {self.model.name}",
                                 log=str(self.log) if self.log else None,
                                 alive=lambda: self.proc is not None and self.proc.poll() is None)
        except InfraError as exc:
            self.stop()
            raise LlamaServerError(str(exc)) from exc
        return self

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def complete(self, body: dict, timeout_s: float = 120.0) -> dict:
        """A blocking `/completion` (set-up checks and benchmarks; the engine streams async)."""
        try:
            response = httpx.post(f"{self.url}/completion", json=body, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise LlamaServerError(f"llama-server at {self.url} did not answer: {exc}") from exc
        if response.status_code != 200:
            raise LlamaServerError(f"llama-server answered {response.status_code}: "
                                   f"{response.text[:300]}")
        return response.json()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

