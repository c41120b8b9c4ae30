"""Re-tokenising LLM calls recorded without token ids: the prompt ids are the ids the engine
gives the same conversation (transformers' chat template, through the engine's own
`chat_prompt_ids`), the response ids decode to the response and end with the end-of-turn token
exactly when the model ended its turn; every recorded shape (OpenAI messages, GenAI messages of
parts, the older indexed attributes) gives the same ids; what cannot be recovered is named."""

from __future__ import annotations

import json
import shutil

import pytest

from producers.otel import OtelSpan, to_span
from serving.engine.prompts import chat_prompt_ids, parse_tool_calls
from streams.chat_tokenizer import ChatTokenizer
from streams.recorded_call import (
    BAD_MESSAGES,
    NO_MESSAGES,
    NO_RESPONSE,
    Unrecoverable,
    recorded_call,
)
from streams.retokenize import NO_TOKENIZER, TEMPLATE_ERROR, Retokenizer, call_ids
from testkit.genai import chat_attributes

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two numbers <a + b>, café-style.",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                    "b": {"type": "number"}},
                   "required": ["a", "b"]}}}]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
USER = {"role": "user", "content": "What is 2 + 3?"}
# name: (request messages, response, finish reason, tools)
CALLS = {
    "one turn": ([{"role": "user", "content": "Name a fruit."}],
                 {"role": "assistant", "content": "An apple."}, "stop", None),
    "system, several turns, non-ASCII": (
        [{"role": "system", "content": "Answer in French."}, USER,
         {"role": "assistant", "content": "Cinq."}, {"role": "user", "content": "Et 3 + 4 ?"}],
        {"role": "assistant", "content": "Sept — naïf 🍎\n  indented"}, "stop", None),
    "cut off by max_tokens": ([USER], {"role": "assistant", "content": "The answer is"},
                              "length", None),
    "calls a tool": ([USER], {"role": "assistant", "content": None, "tool_calls": [CALL]},
                     "tool_calls", TOOLS),
    "after a tool result": (
        [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
         {"role": "tool", "tool_call_id": "call_1", "content": "5"}],
        {"role": "assistant", "content": "The answer is 5."}, "stop", TOOLS),
}


def _otel(attrs: dict) -> dict:
    """Our Span for an OTel span with these attributes, as the gateway's OTLP receiver maps it."""
    return to_span(OtelSpan(name="chat policy", trace_id="ab" * 16, span_id="cd" * 8,
                            parent_id=None, start_ns=1, end_ns=2, status="ok",
                            attributes=attrs))


def _genai(messages, response, finish, tools) -> dict:
    return _otel(chat_attributes(messages, response, finish, tools))


def _indexed(messages, response, finish, tools) -> dict:
    """The older indexed attributes (gen_ai.prompt.N.*, gen_ai.completion.N.*,
    llm.request.functions.N.*), as earlier instrumentations wrote them."""
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "policy"}
    for prefix, items in (("gen_ai.prompt", messages), ("gen_ai.completion", [response])):
        for i, m in enumerate(items):
            attrs[f"{prefix}.{i}.role"] = m["role"]
            if m.get("content") is not None:
                attrs[f"{prefix}.{i}.content"] = m["content"]
            if m.get("tool_call_id"):
                attrs[f"{prefix}.{i}.tool_call_id"] = m["tool_call_id"]
            for j, call in enumerate(m.get("tool_calls") or []):
                attrs[f"{prefix}.{i}.tool_calls.{j}.id"] = call["id"]
                attrs[f"{prefix}.{i}.tool_calls.{j}.name"] = call["function"]["name"]
                attrs[f"{prefix}.{i}.tool_calls.{j}.arguments"] = call["function"]["arguments"]
    attrs["gen_ai.completion.0.finish_reason"] = finish
    for i, tool in enumerate(tools or []):
        for key in ("name", "description"):
            attrs[f"llm.request.functions.{i}.{key}"] = tool["function"][key]
        attrs[f"llm.request.functions.{i}.parameters"] = json.dumps(tool["function"]["parameters"])
    return _otel(attrs)


def _openai(messages, response, finish, tools) -> dict:
    """A span of OpenAI messages (the tracer's shape) that lacks token ids."""
    span = _otel({"gen_ai.operation.name": "chat"})
    span["llm"].update(request_messages=json.dumps(messages),
                       response_text=response["content"], finish_reason=finish)
    return span


SHAPES = {"genai parts": _genai, "indexed attributes": _indexed}


@pytest.fixture(scope="module")
def tokenizers(base_model_dir):
    """Ours, and transformers' (what the engine renders with) for the same folder."""
    from transformers import AutoTokenizer

    return ChatTokenizer(base_model_dir), AutoTokenizer.from_pretrained(base_model_dir)


def _expected_response(hf, response: dict, finish: str) -> list[int]:
    """The response as generation would produce it: its text (a tool call as the model is
    asked to write one), then the end-of-turn token when the model ended its turn."""
    if response.get("tool_calls"):
        call = response["tool_calls"][0]["function"]
        text = "<tool_call>\n" + json.dumps({"name": call["name"],
                                             "arguments": json.loads(call["arguments"])}) + \
            "\n</tool_call>"
    else:
        text = response["content"]
    ids = hf.encode(text, add_special_tokens=False)
    return ids if finish == "length" else [*ids, hf.eos_token_id]


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("name", sorted(CALLS))
def test_ids_are_the_engines_for_the_same_conversation(tokenizers, name, shape):
    ours, hf = tokenizers
    messages, response, finish, tools = CALLS[name]
    prompt, completion = call_ids(ours, recorded_call(SHAPES[shape](*CALLS[name])))
    assert prompt == chat_prompt_ids(hf, messages, tools)
    assert completion == _expected_response(hf, response, finish)
    assert (completion[-1] == hf.eos_token_id) == (finish != "length")
    decoded = hf.decode(completion, skip_special_tokens=True)
    if response.get("tool_calls"):  # the engine would read the same call back from the text
        assert parse_tool_calls(decoded)[1][0]["function"]["name"] == "add"
        assert json.loads(parse_tool_calls(decoded)[1][0]["function"]["arguments"]) == \
            {"a": 2, "b": 3}
    else:
        assert decoded == response["content"]


def test_openai_messages_without_token_ids_and_system_instructions_apart(tokenizers):
    ours, hf = tokenizers
    messages, response, finish, tools = CALLS["system, several turns, non-ASCII"]
    expected = call_ids(ours, recorded_call(_genai(*CALLS["system, several turns, non-ASCII"])))
    assert call_ids(ours, recorded_call(_openai(messages, response, finish, tools))) == expected
    # GenAI conventions may carry the system prompt apart, in gen_ai.system_instructions
    attrs = chat_attributes(messages[1:], response, finish)
    attrs["gen_ai.system_instructions"] = json.dumps([{"type": "text",
                                                       "content": "Answer in French."}])
    assert call_ids(ours, recorded_call(_otel(attrs))) == expected


NATIVE_TOOLS_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{{ messages[0].content if messages[0].role == 'system' else 'You call tools.' }}
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role not in ['system', 'user', 'assistant', 'tool'] %}
{{- raise_exception('unknown role ' + message.role) }}
{%- elif message.role == 'assistant' %}<|im_start|>assistant
{% generation %}{{ message.content or '' }}
{%- for call in message.tool_calls or [] %}<call>{{ call.function | tojson }}</call>{% endfor %}
<|im_end|>{% endgeneration %}
{% elif message.role == 'tool' %}<|im_start|>tool
{{ message.content }}<|im_end|>
{% elif not (tools and message.role == 'system') %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


@pytest.fixture(scope="module")
def native_tools_folder(base_model_dir, tmp_path_factory):
    """The base model's tokenizer with a template that takes tools itself (like Qwen's or
    Llama 3's) and uses tojson, raise_exception and {% generation %}."""
    folder = tmp_path_factory.mktemp("native-tools")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(base_model_dir / name, folder / name)
    (folder / "chat_template.jinja").write_text(NATIVE_TOOLS_TEMPLATE)
    return folder


@pytest.mark.parametrize("name", ["calls a tool", "after a tool result", "one turn"])
def test_a_template_that_takes_tools_renders_as_transformers_does(native_tools_folder, name):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(native_tools_folder)
    ours = ChatTokenizer(native_tools_folder)
    messages, response, finish, tools = CALLS[name]
    prompt, completion = call_ids(ours, recorded_call(_genai(*CALLS[name])))
    assert prompt == chat_prompt_ids(hf, messages, tools)
    # the template's rendering of the assistant turn, up to and with the turn's end
    rendered = hf.apply_chat_template([*messages, response], tools=tools, tokenize=False)
    turn = rendered[len(hf.apply_chat_template(messages, tools=tools, tokenize=False,
                                               add_generation_prompt=True)):]
    assert completion == hf.encode(turn[: turn.rindex("<|im_end|>")],
                                   add_special_tokens=False) + [hf.eos_token_id]
    with pytest.raises(Unrecoverable) as bad_role:
        call_ids(ours, recorded_call(_openai([{"role": "critic", "content": "x"}],
                                             *CALLS["one turn"][1:])))
    assert bad_role.value.reason == TEMPLATE_ERROR and "unknown role critic" in str(bad_role.value)


def test_a_template_that_does_not_end_turns_with_eos_is_named(native_tools_folder, tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(native_tools_folder / name, tmp_path / name)
    (tmp_path / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}")
    with pytest.raises(Unrecoverable) as error:
        call_ids(ChatTokenizer(tmp_path), recorded_call(_genai(*CALLS["one turn"])))
    assert error.value.reason == TEMPLATE_ERROR and "<|im_end|>" in str(error.value)


@pytest.mark.parametrize("change, reason, words", [
    # content capture off: instrumentations record no messages at all
    (lambda a: a.pop("gen_ai.input.messages"), NO_MESSAGES, "no request messages"),
    (lambda a: a.pop("gen_ai.output.messages"), NO_RESPONSE, "no response"),
    (lambda a: a.update({"gen_ai.input.messages": "[{\"role\": \"user\", \"parts\": [{"}),
     BAD_MESSAGES, "not JSON"),
    (lambda a: a.update({"gen_ai.input.messages": json.dumps([{"role": "user", "parts": [
        {"type": "blob", "modality": "image", "content": "..."}]}])}),
     BAD_MESSAGES, "part of type 'blob'"),
    (lambda a: a.update({"gen_ai.input.messages": json.dumps([{"parts": []}])}),
     BAD_MESSAGES, "no role"),
    (lambda a: a.update({"gen_ai.tool.definitions": '"add"'}), BAD_MESSAGES, "list of tools"),
])
def test_calls_whose_messages_cannot_be_recovered_are_named(change, reason, words):
    attrs = chat_attributes(*CALLS["calls a tool"])
    change(attrs)
    with pytest.raises(Unrecoverable) as error:
        recorded_call(_otel(attrs))
    assert error.value.reason == reason and words in str(error.value), str(error.value)


def test_the_tokenizer_loads_on_first_use_and_a_missing_one_is_a_dead_letter(tmp_path):
    asked = []
    retokenize = Retokenizer(lambda: asked.append(1) or tmp_path)
    assert asked == []  # nothing read until a call needs it
    for _ in range(2):  # tried again for each call: a repaired folder needs no restart
        with pytest.raises(Unrecoverable) as error:
            retokenize(_genai(*CALLS["one turn"]))
        assert error.value.reason == NO_TOKENIZER and "tokenizer.json" in str(error.value)
    assert asked == [1, 1]


def _two_responses(attrs: dict) -> None:
    out = json.loads(attrs["gen_ai.output.messages"])
    out[0]["parts"] = [{"type": "tool_call_response", "id": "a", "response": "1"},
                       {"type": "tool_call_response", "id": "b", "response": "2"}]
    attrs["gen_ai.output.messages"] = json.dumps(out)


@pytest.mark.parametrize("change", [
    lambda a: a.update({"gen_ai.input.messages": "[" * 100_000 + "]" * 100_000}),
    lambda a: a.update({"gen_ai.system_instructions": "5"}),
    lambda a: a.update({"gen_ai.input.messages": json.dumps([{"role": "user", "parts": 5}])}),
    _two_responses,
], ids=["nested past the decoder", "instructions a number", "parts a number", "two responses"])
def test_any_sender_json_that_cannot_be_read_is_a_bad_record_never_a_crash(change, tmp_path):
    """Each of these raised out of the worker (RecursionError, TypeError, ValueError), which
    read the same record again after every restart."""
    attrs = chat_attributes(*CALLS["calls a tool"])
    change(attrs)
    with pytest.raises(Unrecoverable) as error:
        Retokenizer(lambda: tmp_path)(_otel(attrs))  # the reading fails before any tokenizer
    assert error.value.reason == BAD_MESSAGES, str(error.value)


def test_an_openai_message_with_an_image_is_refused_not_trained_as_text():
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    span = _openai(messages, {"role": "assistant", "content": "A cat."}, "stop", None)
    with pytest.raises(Unrecoverable) as error:
        recorded_call(span)
    assert error.value.reason == BAD_MESSAGES and "image_url" in str(error.value)
