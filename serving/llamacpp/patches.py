"""Edits to the pinned llama.cpp source, applied before it is built (their digest is part of the
build key, so a changed patch builds a new binary).

Each one is a fix the pipeline needs and upstream does not (yet) make; each names the text it
replaces, and the build stops with a clear error if that text is gone (a new pin must re-check
them), rather than building a server that silently misses the fix.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from tracetrain.errors import TracetrainError


@dataclass(frozen=True)
class Patch:
    path: str  # relative to the llama.cpp tree
    old: str
    new: str
    why: str


PATCHES = (
    Patch(
        path="tools/server/server-context.cpp",
        old="""        if (incomplete) {
            slot.has_next_token = true;
        }
""",
        new="""        if (incomplete) {
            slot.has_next_token = true;
            // tracetrain: a token that ends inside a UTF-8 character keeps its probability and
            // is streamed (without text: its bytes go out with the token that completes it)
            result.text_to_send = "";
            slot.add_token(result);
            if (slot.task->params.stream) {
                send_partial_response(slot, result, false);
            }
        }
""",
        why="llama-server drops the probability (and, streaming, the token id) of every token "
            "that ends inside a multi-byte character (an emoji is 3-4 byte tokens), so the "
            "logprobs would no longer line up with the token ids the learner trains on",
    ),
    Patch(
        path="tools/server/server-context.cpp",
        old="""        if (post_sampling) {
            const auto * cur_p = common_sampler_get_candidates(slot.smpl.get(), true);
            const size_t max_probs = cur_p->size;
            const size_t n_probs = std::min(max_probs, n_probs_request);
""",
        new="""        if (post_sampling) {
            // tracetrain: only the n_probs most likely candidates are put in order (a partial
            // sort, as the pre-sampling path does), not the whole vocabulary at every token
            auto * cur_p = common_sampler_get_candidates(slot.smpl.get(), false);
            const size_t max_probs = cur_p->size;
            const size_t n_probs = std::min(max_probs, n_probs_request);
            if (!cur_p->sorted && n_probs > 0 && cur_p->selected >= 0) {
                const llama_token chosen = cur_p->data[cur_p->selected].id;
                std::partial_sort(cur_p->data, cur_p->data + n_probs, cur_p->data + max_probs,
                    [](const llama_token_data & a, const llama_token_data & b) { return a.p > b.p; });
                for (size_t i = 0; i < max_probs; i++) {
                    if (cur_p->data[i].id == chosen) {
                        cur_p->selected = i;
                        break;
                    }
                }
            }
""",
        why="the engine asks for post-sampling probabilities (those of the temperature it "
            "sampled at, what the learner scores), and llama-server sorts all 49k candidates "
            "by probability for every generated token to report the top one: measured, 8 "
            "concurrent requests decoded at 0.65x bare llama-server instead of 0.93x",
    ),
)


class PatchError(TracetrainError):
    """The pinned source no longer has the text a patch replaces."""


def digest() -> str:
    text = "".join(p.path + p.old + p.new for p in PATCHES)
    return hashlib.sha1(text.encode()).hexdigest()


def apply(tree: Path) -> None:
    """Apply every patch to `tree` (idempotent: an applied patch is left as it is)."""
    for patch in PATCHES:
        file = tree / patch.path
        text = file.read_text()
        if patch.new in text:
            continue
        if text.count(patch.old) != 1:
            raise PatchError(f"{file} does not contain the text to patch exactly once "
                             f"({patch.why}); re-check serving/llamacpp/patches.py for this pin")
        file.write_text(text.replace(patch.old, patch.new))
