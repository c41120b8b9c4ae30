"""How the reloader talks to an engine: the embedded one or vLLM, through their HTTP APIs.

Embedded: `POST /v1/load_lora_adapter` (vLLM's shape plus `policy_version`),
`POST /v1/load_checkpoint` for full weights, both with `Authorization: Bearer <load key>`;
`GET /v1/policy` to verify.
vLLM: `POST /v1/load_lora_adapter {"lora_name","lora_path","load_inplace": true}` (needs
VLLM_ALLOW_RUNTIME_LORA_UPDATING=1), `POST /collective_rpc {"method": "reload_weights"}` (needs
VLLM_SERVER_DEV_MODE=1) for full weights, `GET /v1/models` (a LoRA entry's `root` is its path)
to verify. vLLM reports no policy version, so each LoRA version is loaded twice: as the plain
name (in place, for clients that call the engine directly) and as `<name>-v<policy_version>`
(tracetrain/served_names.py), which the gateway sends its calls to and reads the version back
from; the versioned adapters older than the previous one are unloaded
(`POST /v1/unload_lora_adapter`).
"""

from __future__ import annotations

import logging

import httpx

from serving.errors import LoadError, ServingError
from tracetrain import served_names

log = logging.getLogger(__name__)
# Versioned vLLM adapters kept loaded: the new one and the previous one, which calls the
# gateway sent before it saw the new name may still ask for.
VERSIONED_KEPT = 2


class EngineUnavailable(ServingError):
    """The engine did not answer (down or restarting); retry later, the version is not to blame."""


class EngineClient:
    def __init__(self, base_url: str, backend: str = "embedded", lora_name: str = "policy",
                 timeout_s: float = 120.0, load_key: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.backend = backend
        self.lora_name = lora_name
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout_s)
        # The embedded engine's load routes need its load key (serving/access.py).
        self._auth = {"authorization": f"Bearer {load_key}"} \
            if load_key and backend == "embedded" else {}
        self._full_path: str | None = None  # vLLM: reload_weights has no version to read back

    def _post(self, path: str, payload: dict) -> httpx.Response:
        try:
            response = self.http.post(path, json=payload, headers=self._auth)
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"engine at {self.base_url} did not answer {path}: "
                                    f"{type(exc).__name__}: {exc}") from exc
        if response.status_code in (502, 503, 504):
            raise EngineUnavailable(f"engine at {self.base_url} answered {path} with "
                                    f"{response.status_code}")
        if response.status_code >= 400:
            raise LoadError(f"engine refused {path} ({response.status_code}): "
                            f"{response.text[:500]}")
        return response

    def load_lora(self, path: str, policy_version: int) -> None:
        payload = {"lora_name": self.lora_name, "lora_path": path, "load_inplace": True}
        if self.backend == "embedded":
            payload["policy_version"] = policy_version
            self._post("/v1/load_lora_adapter", payload)
            return
        self._post("/v1/load_lora_adapter", payload)
        self._post("/v1/load_lora_adapter", {
            **payload, "lora_name": served_names.versioned(self.lora_name, policy_version)})
        self._unload_old_versions()

    def _unload_old_versions(self) -> None:
        """Unload the versioned adapters of this name but the newest VERSIONED_KEPT (vLLM
        keeps every adapter it loaded registered); one that fails stays, with a warning."""
        versions = sorted(v for name, v in (served_names.parse(m) or ("", 0)
                                            for m in self._model_ids())
                          if name == self.lora_name)
        for version in versions[:-VERSIONED_KEPT]:
            name = served_names.versioned(self.lora_name, version)
            try:
                self._post("/v1/unload_lora_adapter", {"lora_name": name})
            except ServingError as exc:
                log.warning("could not unload the old adapter %s: %s", name, exc)

    def _model_ids(self) -> list[str]:
        return [m.get("id", "") for m in self._models()]

    def _models(self) -> list[dict]:
        try:
            return self.http.get("/v1/models").json().get("data", [])
        except (httpx.HTTPError, ValueError) as exc:
            raise EngineUnavailable(f"engine at {self.base_url} did not list its models: "
                                    f"{exc}") from exc

    def load_full(self, path: str, policy_version: int) -> None:
        if self.backend == "embedded":
            self._post("/v1/load_checkpoint", {"path": path, "policy_version": policy_version})
        else:
            # vLLM's dev-mode RPC: args/kwargs travel as strings; the worker reloads in place.
            self._post("/collective_rpc", {"method": "reload_weights",
                                           "kwargs": {"weights_path": path}})
            self._full_path = path

    def serves(self, path: str, policy_version: int) -> bool:
        """Does the engine report that it now serves this version?"""
        try:
            if self.backend == "embedded":
                info = self.http.get("/v1/policy").json()
                return info.get("policy_version") == policy_version
        except (httpx.HTTPError, ValueError) as exc:
            raise EngineUnavailable(f"engine at {self.base_url} did not report its version: "
                                    f"{exc}") from exc
        if self._full_path == path:
            return True
        roots = {m.get("id"): m.get("root") for m in self._models()}
        return all(roots.get(name) == path for name in (
            self.lora_name, served_names.versioned(self.lora_name, policy_version)))

    def close(self) -> None:
        self.http.close()
