"""What the policy's chat template is given for OpenAI chat messages (and tools): the one
preparation that both the engine (which renders with transformers) and the streams'
re-tokenisation of OpenTelemetry calls (which renders without it) use, so that a call's prompt
is the same token ids whichever of them made it.

    chat, tools = template_chat(template_text, messages, tools, tool_choice)

Tools go through the chat template when it knows them (`tools` in the template); otherwise a
Hermes-style system prompt lists them in `<tools>` and asks for `<tool_call>{json}</tool_call>`,
and tool results return as `<tool_response>` turns, as vLLM's `hermes` parser expects. An
assistant turn's tool calls are written the way the model is asked to write them, so a call
made in one turn reads back the same in the next turn's prompt.
"""

from __future__ import annotations

import json
from typing import Any

HERMES_SYSTEM = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one or more functions to assist with the user "
    "query. Don't make assumptions about what values to plug into functions. Here are the "
    "available tools: <tools>\n{tools}\n</tools>\nFor each function call return a json object "
    "with function name and arguments within <tool_call></tool_call> XML tags as follows:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-dict>}}\n</tool_call>'
)


def text_of(content: Any) -> str:
    """OpenAI content is a string or a list of parts; only text parts are understood here."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def template_chat(template: str, messages: list[dict], tools: list[dict] | None = None,
                  tool_choice: Any = None) -> tuple[list[dict], list[dict] | None]:
    """The messages the chat template renders, and the tools it is given (None: the tools,
    if any, are in the Hermes system prompt instead)."""
    if tools and "tools" in template and tool_choice != "none":
        return [{**m, "content": text_of(m.get("content"))} for m in messages], tools
    return _hermes_messages(messages, tools, tool_choice), None


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
