"""The policy's tokenizer and chat template in the streams worker, without transformers.

    tokenizer = ChatTokenizer(resolve_base_model(settings.base_model, settings.home_dir))
    text = tokenizer.render(chat, tools, add_generation_prompt=True)
    ids = tokenizer.encode(text)

transformers' `AutoTokenizer` would bring torch into the worker: about 0.9 GB of memory and
15 s of import on this machine, against 66 MB and 0.25 s for the Rust `tokenizers` library and
jinja2 that it is built on. So this renders the template as transformers'
`apply_chat_template` does (its jinja environment: sandboxed, `trim_blocks`, `lstrip_blocks`,
loop controls, its `tojson`, `raise_exception` and `strftime_now`, the special tokens as
variables) and encodes the text as it does (no special tokens added: the template writes
them); tests/streams/test_streams_retokenize.py checks the ids against transformers'.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from streams.errors import StreamsError

# The special tokens transformers hands the template as variables (its special_tokens_map).
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                  "mask_token")


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _template_text(folder: Path, config: dict) -> str:
    path = folder / "chat_template.jinja"  # where transformers 5 saves it
    if path.is_file():
        return path.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one renders chats
        template = {t.get("name"): t.get("template") for t in template}.get("default")
    if not isinstance(template, str):
        raise StreamsError(f"{folder} has no chat template (expected chat_template.jinja or "
                           "chat_template in tokenizer_config.json): calls without token ids "
                           "cannot be re-tokenised; set TRACETRAIN_STREAMS__RETOKENIZE=false")
    return template


def _compile(template: str):
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """`{% generation %}` marks assistant text for transformers' assistant masks; the text
        renders unchanged, which is all a prompt needs."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja's own tojson escapes HTML characters, which would change the prompt
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


class ChatTokenizer:
    """A base model folder's tokenizer (`tokenizer.json`) and chat template."""

    def __init__(self, folder: Path):
        from tokenizers import Tokenizer

        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise StreamsError(f"{path} is missing: the streams stage re-tokenises calls with the "
                               "base model's fast tokenizer (tokenizer.json)")
        self.tokenizer = Tokenizer.from_file(str(path))
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.template_text = _template_text(folder, config)
        self.template = _compile(self.template_text)
        self.special = {name: text for name in SPECIAL_TOKENS
                        if (text := _token_text(config.get(name))) is not None}
        self.turn_ends = self._turn_ends(folder)

    def _turn_ends(self, folder: Path) -> set[str]:
        """The tokens generation stops at (the tokenizer's eos and the generation config's):
        the one that closes an assistant turn is the last token the model produced."""
        ends = {self.special["eos_token"]} if "eos_token" in self.special else set()
        generation = folder / "generation_config.json"
        if generation.is_file():
            ids = json.loads(generation.read_text()).get("eos_token_id")
            for token_id in ids if isinstance(ids, list) else [ids]:
                if isinstance(token_id, int) and (token := self.tokenizer.id_to_token(token_id)):
                    ends.add(token)
        return ends

    def render(self, chat: list[dict], tools: list[dict] | None,
               add_generation_prompt: bool) -> str:
        return self.template.render(messages=chat, tools=tools, documents=None,
                                    add_generation_prompt=add_generation_prompt, **self.special)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
