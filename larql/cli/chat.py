"""`larql run MODEL` with no prompt: a chat in the terminal.

The conversation is rendered with the model's chat template (its GGUF's or HF directory's, else the
turn markers its vocabulary has: see model/chat_template.py) or, for a model with neither, as plain
continuation (each line is appended to the text and the model carries on). Replies stream token by
token with `larql run`'s sampling flags.

The KV cache is kept between turns. Each turn the whole conversation is rendered to token ids again,
and only the part after the longest prefix the cache already holds is run (the cache is cut back to
that prefix first, which is exact: a position's keys and values depend only on the tokens before it).
So a turn costs its own new tokens, not the conversation's, and the template's closing tokens or a
re-tokenized reply that differs from the sampled tokens cost only from where they differ.

    /reset   forget the conversation (and the cache)
    /exit    leave (so does Ctrl-D, or /quit)
    Ctrl-C   stops a reply (the part already shown stays in the conversation); at the prompt, clears the line
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from larql.errors import ContextLengthError

if TYPE_CHECKING:
    from larql.model.chat_template import ChatTemplate
    from larql.model.generate import SamplingParams
    from larql.model.model import Model

HELP = "/reset starts over, /exit or Ctrl-D leaves, Ctrl-C stops a reply"


@dataclass
class TurnStats:
    """What the last turn cost: prompt tokens run, prompt tokens the cache already held, tokens generated."""

    prefilled: int = 0
    reused: int = 0
    generated: int = 0
    stopped: bool = False  # interrupted with Ctrl-C


def common_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of two id lists."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def chat_template(model: Model) -> ChatTemplate | None:
    """The model's chat template, or None when it has none (no template in its files, no turn markers
    in its vocabulary): then the chat is plain continuation."""
    from larql.model.chat_template import find_template

    index = None
    source = Path(model.source)
    if (source / "index.json").is_file():  # a vindex: the template of the model it was extracted from
        from larql.errors import VindexError
        from larql.io.jsonfile import read_json

        try:
            index = read_json(source / "index.json", 16 << 20, 64, "index.json", VindexError)
        except VindexError:
            index = None
    found = find_template(model, source, index)
    return None if found.origin.startswith("built-in plain") else found


class Conversation:
    """A chat with a model: the messages so far and a KV cache over the ids it has run."""

    def __init__(self, model: Model, template: ChatTemplate | None) -> None:
        self.model, self.template = model, template
        self.messages: list[dict[str, Any]] = []
        self.cache = model.new_cache()
        self.cached: list[int] = []  # the ids whose keys and values are in the cache, in order
        self.last = TurnStats()

    def reset(self) -> None:
        self.messages.clear()
        self.cache.length = 0
        self.cached = []

    def prompt_ids(self) -> list[int]:
        """The whole conversation as the model reads it, ending where the assistant speaks next."""
        if self.template is not None:
            return self.template.render(self.model, self.messages)
        # plain continuation: the text as the terminal shows it, a reply ending its line
        return self.model.tokenize("".join(m["content"] + ("\n" if m["role"] == "assistant" and
                                                            not m["content"].endswith("\n") else "")
                                           for m in self.messages))

    def reply(self, text: str, params: SamplingParams, max_tokens: int) -> Iterator[str]:
        """Add the user's `text` and yield the reply's text as it is generated (not the stop token).
        Closing the generator early (Ctrl-C) keeps the reply so far."""
        from larql.model.generate import sample

        model = self.model
        self.messages.append({"role": "user", "content": text})
        ids = self.prompt_ids()
        try:
            model.check_fits(ids, max_tokens)
        except ContextLengthError:
            self.messages.pop()
            raise
        keep = min(common_prefix(self.cached, ids), len(ids) - 1)  # at least one id runs: its logits are needed
        self.cache.length, self.cached = keep, self.cached[:keep]
        self.last = TurnStats(prefilled=len(ids) - keep, reused=keep)
        rng = np.random.default_rng(params.seed)
        new: list[int] = []
        shown = ""
        reply = {"role": "assistant", "content": ""}
        self.messages.append(reply)
        try:
            logits = model.next_logits(ids[keep:], self.cache)
            self.cached = list(ids)  # only once the forward pass finished (an interrupt leaves the cache as it was)
            for _ in range(max_tokens):
                tok = sample(logits, params, rng)
                if tok in model.tokenizer.eos_ids:
                    break
                new.append(tok)
                self.last.generated = len(new)
                decoded = model.detokenize(new)
                if not decoded.endswith("\ufffd"):  # wait for the rest of a multi-byte character
                    reply["content"] = decoded
                    piece, shown = decoded[len(shown):], decoded
                    if piece:
                        yield piece
                if len(new) == max_tokens:
                    break
                logits = model.next_logits([tok], self.cache)
                self.cached.append(tok)
        except (KeyboardInterrupt, GeneratorExit):
            self.last.stopped = True
            if not shown:  # stopped before a word of the reply: the question is withdrawn with it
                del self.messages[-2:]
            raise
        finally:
            reply["content"] = shown


def _read(prompt: str, interactive: bool) -> str | None:
    """One line from the user; None at end of input."""
    try:
        return input(prompt if interactive else "")
    except EOFError:
        return None


def run_chat(model: Model, args: argparse.Namespace, out: TextIO | None = None) -> int:
    """The terminal chat loop of `larql run MODEL` (no prompt); returns the exit code."""
    from larql.model.generate import SamplingParams

    out = out or sys.stdout
    interactive = sys.stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401 - line editing and history for input()
        except ImportError:
            pass
    template = chat_template(model)
    talk = Conversation(model, template)
    params = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    mode = f"chat template: {template.origin}" if template else "no chat template: plain continuation"
    sys.stderr.write(f"{model.name} ({mode}; up to {args.max_tokens} tokens a reply). {HELP}.\n")
    sys.stderr.flush()
    while True:
        try:
            line = _read("> ", interactive)
        except KeyboardInterrupt:  # at the prompt: drop the line, ask again
            out.write("\n")
            continue
        if line is None or line.strip() in ("/exit", "/quit"):
            if line is None and interactive:
                out.write("\n")
            return 0
        if line.strip() == "/reset":
            talk.reset()
            sys.stderr.write("(conversation cleared)\n")
            continue
        if not line.strip():
            continue
        try:
            for piece in talk.reply(line if template else line + "\n", params, args.max_tokens):
                out.write(piece)
                out.flush()
        except KeyboardInterrupt:
            out.write(" [stopped]")
        except ContextLengthError as e:
            sys.stderr.write(f"larql: error: {e}; /reset starts a new conversation\n")
            continue
        out.write("\n")
        out.flush()
        if getattr(args, "stats", False):
            s = talk.last
            sys.stderr.write(f"[{s.generated} tokens; prompt: {s.prefilled} run, {s.reused} from the cache]\n")
