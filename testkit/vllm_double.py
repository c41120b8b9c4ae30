"""A TEST DOUBLE of vLLM's OpenAI server (vLLM needs CUDA; this machine has none): a small real
HTTP server, not vLLM, that answers the calls tracetrain makes the way `vllm serve
--enable-lora` does, and records every one of them.

- `GET /v1/models`: the base model (`BASE`) and each loaded LoRA adapter (`root`: its path).
- `POST /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace"}`, `POST
  /v1/unload_lora_adapter {"lora_name"}` (404 for a name not loaded), `POST /collective_rpc`.
- `POST /v1/chat/completions`: a fixed answer with token ids and logprobs (as with
  `return_token_ids` and `logprobs`), its `model` the name the request asked for, and, as
  vLLM, no policy version (neither a field nor a header); a model that is neither the base
  nor a loaded adapter gets vLLM's 404.

    double = VllmDouble(); server = ServerThread(double.app(), port).start()
    double.calls    # [(method, path, body or None), ...]
"""

from __future__ import annotations

import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

BASE = "smollm2"
PROMPT_IDS = [1, 9906, 2]
RESPONSE_IDS = [100, 101, 2]
LOGPROBS = [-0.25, -0.5, -0.125]


class VllmDouble:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict | None]] = []
        self.loras: dict[str, str] = {}  # lora_name -> lora_path, in load order

    def app(self) -> FastAPI:
        api = FastAPI()

        @api.get("/v1/models")
        async def models():
            self.calls.append(("GET", "/v1/models", None))
            data = [{"id": BASE, "object": "model", "root": "/base", "parent": None}]
            data += [{"id": n, "object": "model", "root": p, "parent": BASE}
                     for n, p in self.loras.items()]
            return {"object": "list", "data": data}

        @api.post("/v1/load_lora_adapter")
        async def load(request: Request):
            body = await request.json()
            self.calls.append(("POST", "/v1/load_lora_adapter", body))
            self.loras[body["lora_name"]] = body["lora_path"]
            return PlainTextResponse(f"Success: LoRA adapter '{body['lora_name']}' added "
                                     "successfully.")

        @api.post("/v1/unload_lora_adapter")
        async def unload(request: Request):
            body = await request.json()
            self.calls.append(("POST", "/v1/unload_lora_adapter", body))
            if self.loras.pop(body["lora_name"], None) is None:
                return JSONResponse({"error": {"message": f"The lora adapter "
                                               f"'{body['lora_name']}' cannot be found.",
                                               "type": "NotFoundError", "code": 404}}, 404)
            return PlainTextResponse(f"Success: LoRA adapter '{body['lora_name']}' removed "
                                     "successfully.")

        @api.post("/collective_rpc")
        async def rpc(request: Request):
            self.calls.append(("POST", "/collective_rpc", await request.json()))
            return {"results": [None]}

        @api.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            self.calls.append(("POST", "/v1/chat/completions", body))
            model = body.get("model")
            if model != BASE and model not in self.loras:
                return JSONResponse({"error": {"message": f"The model `{model}` does not "
                                               "exist.", "type": "NotFoundError", "param":
                                               "model", "code": 404}}, status_code=404)
            entries = [{"token": f"t{i}", "logprob": lp, "bytes": None, "top_logprobs": []}
                       for i, lp in zip(RESPONSE_IDS, LOGPROBS, strict=True)]
            return {"id": "chatcmpl-double", "object": "chat.completion",
                    "created": int(time.time()), "model": model,
                    "prompt_token_ids": PROMPT_IDS,
                    "choices": [{"index": 0, "finish_reason": "stop", "token_ids": RESPONSE_IDS,
                                 "message": {"role": "assistant", "content": "t100t101"},
                                 "logprobs": {"content": entries}}],
                    "usage": {"prompt_tokens": len(PROMPT_IDS),
                              "completion_tokens": len(RESPONSE_IDS),
                              "total_tokens": len(PROMPT_IDS) + len(RESPONSE_IDS)}}

        return api
