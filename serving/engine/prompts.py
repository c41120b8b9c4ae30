"""OpenAI chat messages (and tools) to prompt token ids; tool calls out of the generated text.

Tools go through the chat template when it knows them (`tools` in the template); otherwise a
Hermes-style system prompt lists them in `<tools>` and asks for `<tool_call>{json}</tool_call>`,
and tool results return as `<tool_response>` turns, as vLLM's `hermes` parser expects. A tool
call that does not parse comes back as plain content, never as an error.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

HERMES_SYSTEM = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one or more functions to assist with the user "
    "query. Don't make assumptions about what values to plug into functions. Here are the "
    "available tools: <tools>\n{tools}\n</tools>\nFor each function call return a json object "
    "with function name and arguments within <tool_call></tool_call> XML tags as follows:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-dict>}}\n</tool_call>'
)
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def text_of(content: Any) -> str:
    """OpenAI content is a string or a list of parts; only text parts are understood here."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def _hermes_messages(messages: list[dict], tools: list[dict] | None,
                     tool_choice: Any) -> list[dict]:
    out: list[dict] = []
    for message in messages:
        role, content = message.get("role"), text_of(message.get("content"))
        if role == "assistant" and message.get("tool_calls"):
            calls = [
                "<tool_call>\n" + json.dumps({
                    "name": call["function"]["name"],
                    "arguments": _as_object(call["function"].get("arguments")),
                }) + "\n</tool_call>"
                for call in message["tool_calls"]
            ]
            content = "\n".join(([content] if content else []) + calls)
        elif role == "tool":
            role, content = "user", f"<tool_response>\n{content}\n</tool_response>"
        elif role == "developer":
            role = "system"
        out.append({"role": role, "content": content})
    if tools and tool_choice != "none":
        system = HERMES_SYSTEM.format(tools="\n".join(json.dumps(t) for t in tools))
        if tool_choice == "required":
            system += "\nYou must call at least one function."
        elif isinstance(tool_choice, dict) and tool_choice.get("function"):
            system += f"\nYou must call the function {tool_choice['function'].get('name')}."
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + system}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out


def _as_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def chat_prompt_ids(tokenizer, messages: list[dict], tools: list[dict] | None = None,
                    tool_choice: Any = None) -> list[int]:
    template = tokenizer.chat_template or ""
    kwargs: dict[str, Any] = {}
    if tools and "tools" in template and tool_choice != "none":
        kwargs["tools"] = tools
        chat = [{**m, "content": text_of(m.get("content"))} for m in messages]
    else:
        chat = _hermes_messages(messages, tools, tool_choice)
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
