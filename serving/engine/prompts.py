"""OpenAI chat messages (and tools) to prompt token ids; tool calls out of the generated text.

What the chat template is given (tools natively or in a Hermes system prompt) is decided by
`tracetrain.chat_template`, shared with the streams' re-tokenisation of OpenTelemetry calls. A
tool call that does not parse comes back as plain content, never as an error.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from tracetrain.chat_template import template_chat

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def chat_prompt_ids(tokenizer, messages: list[dict], tools: list[dict] | None = None,
                    tool_choice: Any = None) -> list[int]:
    chat, template_tools = template_chat(tokenizer.chat_template or "", messages, tools,
                                         tool_choice)
    kwargs: dict[str, Any] = {"tools": template_tools} if template_tools else {}
    encoded = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                            return_dict=True, **kwargs)
    return list(encoded["input_ids"])


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) from generated text; unparseable calls leave the text as content."""
    if "<tool_call>" not in text:
        return text, []
    calls = []
    for raw in TOOL_CALL.findall(text):
        try:
            data = json.loads(raw)
        except json.JSONDecodeError:
            return text, []
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            return text, []
        arguments = data.get("arguments", data.get("parameters", {}))
        calls.append({
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": data["name"],
                         "arguments": arguments if isinstance(arguments, str)
                         else json.dumps(arguments)},
        })
    content = TOOL_CALL.sub("", text).strip()
    return (content or None), calls
