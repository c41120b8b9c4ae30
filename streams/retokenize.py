"""Token ids for an LLM call recorded without them (OTLP, the OpenTelemetry exporter, any
framework instrumented with the GenAI conventions), from its recorded messages and response.

    retokenizer = Retokenizer.from_settings(settings)     # None: streams.retokenize is off
    prompt_ids, response_ids = retokenizer(span)          # or Unrecoverable(reason, detail)

The policy's own tokenizer and chat template (the base model's folder, `model_dir`, never
converted here; loaded on first use and kept) render the call as the engine would have:
- the prompt is the request messages (and tools) through the template with the generation
  prompt, exactly what the embedded engine sends llama-server (`tracetrain.chat_template`
  decides what the template is given, for both);
- the response is the assistant turn as the same template writes it after that prompt: the
  conversation with the response appended, rendered without the generation prompt, minus the
  prompt's text, cut after the token that closes the turn. That token is one generation stops
  at (eos or the generation config's), and a model that ended its turn generated it, so it is
  trained on; a response cut off (`length`, a content filter) ends before it (one stopped by
  a stop sequence reads `stop` too, and gets the token it did not generate). What the
  template writes after it (ChatML's newline) is the template's separator, never sampled.
  The response's text is tokenised on its own, as generation produces it after the prompt, so
  no merge can cross the boundary.
The ids are the canonical tokenisation of the text: the engine may have sampled another
sequence of tokens for the same text, and a template other than the serving one gives other
ids. Neither can be checked without the engine's own ids, which is why the transition says it
was re-tokenised.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from streams.chat_tokenizer import ChatTokenizer
from streams.recorded_call import BAD_MESSAGES, RecordedCall, Unrecoverable, recorded_call
from tracetrain.chat_template import template_chat
from tracetrain.errors import TracetrainError
from tracetrain.settings import Settings

TEMPLATE_ERROR, NO_TOKENIZER = "template_error", "no_tokenizer"


def call_ids(tokenizer: ChatTokenizer, call: RecordedCall) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) of a recorded call; Unrecoverable when the template cannot
    render it."""
    from jinja2.exceptions import TemplateError

    template = tokenizer.template_text
    try:
        chat, tools = template_chat(template, call.messages, call.tools)
        prompt = tokenizer.render(chat, tools, add_generation_prompt=True)
        chat, tools = template_chat(template, [*call.messages, call.response], call.tools)
        conversation = tokenizer.render(chat, tools, add_generation_prompt=False)
    except (TemplateError, TypeError, KeyError, AttributeError) as exc:
        raise Unrecoverable(TEMPLATE_ERROR, f"the chat template cannot render the call: "
                            f"{exc!r}") from exc
    if not conversation.startswith(prompt):
        raise Unrecoverable(TEMPLATE_ERROR, "the chat template renders the conversation with "
                            "the response differently from the prompt it renders without it; "
                            "the response's tokens cannot be told apart")
    turn = conversation[len(prompt):]
    closes = [(turn.rfind(end), end) for end in tokenizer.turn_ends]
    at, end = max(closes, default=(-1, ""))
    if at < 0:
        raise Unrecoverable(TEMPLATE_ERROR, f"the chat template closes the assistant turn "
                            f"{turn[-40:]!r} with none of the tokens generation stops at "
                            f"{sorted(tokenizer.turn_ends)}")
    response = turn[: at + len(end)] if call.ended else turn[:at]
    try:
        return tokenizer.encode(prompt), tokenizer.encode(response)
    except (TypeError, ValueError) as exc:  # text no UTF-8 encoder takes
        raise Unrecoverable(TEMPLATE_ERROR, f"the call's text cannot be tokenised: {exc}") from exc


class Retokenizer:
    """Loads the policy's tokenizer on first use: a worker that never sees a call without
    token ids never reads it, nor converts the base model. A tokenizer that cannot be loaded
    dead-letters the call (`no_tokenizer`, naming the folder and why) and is tried again for
    the next one, so a worker goes on with its other work and a repaired folder needs no
    restart."""

    def __init__(self, folder: Callable[[], Path]):
        self._folder = folder
        self._tokenizer: ChatTokenizer | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> Retokenizer | None:
        if not settings.streams.retokenize:
            return None
        from tracetrain.base_model import model_dir

        # Never converted here: a conversion imports torch and takes the event loop for many
        # seconds. Until the learner (or `python -m tracetrain.base_model`) has written the
        # folder, such calls are dead-lettered `no_tokenizer`, and replayable from the DLQ.
        return cls(lambda: model_dir(settings.base_model, settings.home_dir))

    @property
    def tokenizer(self) -> ChatTokenizer:
        if self._tokenizer is None:
            try:
                self._tokenizer = ChatTokenizer(self._folder())
            except (TracetrainError, OSError, ValueError) as exc:
                raise Unrecoverable(NO_TOKENIZER, f"the policy's tokenizer cannot be loaded: "
                                    f"{exc}") from exc
        return self._tokenizer

    def __call__(self, span: dict) -> tuple[list[int], list[int]]:
        try:
            call = recorded_call(span)
        except Unrecoverable:
            raise
        # Whatever else a sender's JSON makes the reading raise (nesting past the decoder's
        # depth, parts that are not a list, two responses) is a bad record, not a worker crash
        # that would read the same record again after every restart.
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            raise Unrecoverable(BAD_MESSAGES, f"the recorded messages cannot be read: "
                                f"{type(exc).__name__}: {str(exc)[:200]}") from exc
        return call_ids(self.tokenizer, call)
