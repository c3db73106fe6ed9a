"""`larql repl`: prompt_toolkit wiring only — history, accept-on-';', highlighting, completion,
dot-commands, Ctrl-C cancels a statement (not the session), Ctrl-D exits. Statements run through the
same executor and renderer as `larql lql`."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from prompt_toolkit import PromptSession
from prompt_toolkit.completion import Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.history import FileHistory, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings
from prompt_toolkit.lexers import Lexer
from prompt_toolkit.styles import Style
from rich.console import Console

from larql.errors import LarqlError
from larql.lql.complete import complete, current_statement, vocabulary_lookup
from larql.lql.executor import run_statement
from larql.lql.parser import _lark, parse
from larql.lql.planner import plan
from larql.lql.session import Session
from larql.meta_commands import META, ReplState
from larql.render import render, render_json

STYLE = Style.from_dict({"keyword": "bold ansiblue", "string": "ansigreen", "number": "ansimagenta",
                         "comment": "italic ansibrightblack"})
_TOKENS = re.compile(r"(--[^\n]*)|(\"(?:[^\"\\]|\\.)*\"?|'(?:[^'\\]|\\.)*'?)|(\d+(?:\.\d*)?)|([A-Za-z_][A-Za-z0-9_]*)|(\s+|.)")


def keywords() -> frozenset[str]:
    return frozenset(str(t.pattern.value).upper() for t in _lark().terminals
                     if t.pattern.type == "str" and str(t.pattern.value).replace("_", "").isalpha())


class LqlLexer(Lexer):
    def __init__(self) -> None:
        self.words = keywords()

    def lex_document(self, document: Document) -> Callable[[int], list[tuple[str, str]]]:
        lines = document.lines

        def line(i: int) -> list[tuple[str, str]]:
            out = []
            for m in _TOKENS.finditer(lines[i]):
                comment, string, number, word, other = m.groups()
                if comment:
                    out.append(("class:comment", comment))
                elif string:
                    out.append(("class:string", string))
                elif number:
                    out.append(("class:number", number))
                elif word:
                    out.append(("class:keyword" if word.upper() in self.words else "", word))
                else:
                    out.append(("", other))
            return out

        return line


class LqlCompleter(Completer):
    def __init__(self, session: Session) -> None:
        self.session = session
        self._entities: tuple[Any, Callable[[str], list[str]]] | None = None

    def entities(self, partial: str) -> Iterable[str]:
        v = self.session.vindex
        if v is None:
            return []
        if self._entities is None or self._entities[0] is not v:
            texts = v.tokenizer.tok.decode_batch([[i] for i in range(v.vocab_size)], skip_special_tokens=False)
            self._entities = (v, vocabulary_lookup(texts))
        return self._entities[1](partial)

    def get_completions(self, document: Document, complete_event: Any) -> Iterable[Completion]:
        for s in complete(document.text_before_cursor, self.entities):
            yield Completion(s.text, start_position=-s.start, display_meta=s.kind)


def statement_complete(text: str) -> bool:
    """Enter submits a dot-command, an empty line, or text ending in ';' outside quotes and comments."""
    stripped = text.strip()
    if not stripped or stripped.startswith("."):
        return True
    lines = [ln for ln in stripped.splitlines() if not ln.strip().startswith("--")]
    tail = "\n".join(lines).rstrip()
    return tail.endswith(";") and current_statement(tail + " ").strip() == ""


def _bindings() -> KeyBindings:
    kb = KeyBindings()

    @kb.add("enter")
    def _(event: Any) -> None:
        buf = event.current_buffer
        if statement_complete(buf.text):
            buf.validate_and_handle()
        else:
            buf.insert_text("\n")

    return kb


def history_path() -> Path:
    return Path(os.environ.get("LARQL_HISTORY", Path.home() / ".larql_history"))


def run_repl(vindex: str | None = None, input: Any = None, output: Any = None, console: Console | None = None,
             persistent_history: bool = True, json_output: bool = False) -> int:
    """The read-eval-print loop. `input`/`output`/`console` let tests drive it through a pipe."""
    session = Session()
    state = ReplState(json=json_output)
    console = console or Console()
    if vindex:
        from larql.edit.view import edit_vindex

        session.vindex = edit_vindex(vindex)
        console.print(f"Using: {session.describe_backend()}", markup=False, highlight=False)
    history = FileHistory(str(history_path())) if persistent_history else InMemoryHistory()
    prompt: PromptSession[str] = PromptSession(
        message="lql> ", multiline=True, prompt_continuation="...> ", key_bindings=_bindings(), history=history,
        lexer=LqlLexer(), completer=LqlCompleter(session), style=STYLE, input=input, output=output,
        complete_while_typing=False)
    while not state.done:
        try:
            text = prompt.prompt()
        except KeyboardInterrupt:  # Ctrl-C at the prompt clears the line
            continue
        except EOFError:  # Ctrl-D
            break
        if not text.strip():
            continue
        try:
            if text.strip().startswith("."):
                message = META.run(text, state, session)
                if message:
                    console.print(message, markup=False, highlight=False)
                continue
            session.source = text
            for stmt in parse(text):
                if state.plan:
                    console.print(plan(stmt, session).to_text(), markup=False, highlight=False)
                    continue
                for result in run_statement(stmt, session):
                    if state.json:
                        render_json(result, console.file)
                    else:
                        render(result, console, timing=state.timing)
        except KeyboardInterrupt:
            console.print("statement cancelled", style="yellow")
        except LarqlError as e:
            console.print(f"{type(e).__name__}: {e}", style="red", markup=False, highlight=False)
    return 0
