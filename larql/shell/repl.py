"""`larql repl`: prompt_toolkit wiring only — history, accept-on-';', highlighting, completion,
dot-commands, Ctrl-C cancels a statement (not the session), Ctrl-D exits. Statements run through the
same executor and renderer as `larql lql`."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

from prompt_toolkit import PromptSession
from prompt_toolkit.completion import Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings
from prompt_toolkit.lexers import Lexer
from prompt_toolkit.styles import Style
from rich.console import Console

from larql.errors import LarqlError
from larql.lql.complete import complete, current_statement, vocabulary_lookup
from larql.lql.executor import run_statement
from larql.lql.parser import lark_parser, parse
from larql.lql.planner import plan
from larql.lql.session import Session
from larql.lql.unparse import unparse
from larql.shell.meta_commands import META, ReplState, shell_word
from larql.shell.progress import StatementProgress
from larql.shell.render import print_wrapped, render, render_json
from larql.shell.repl_config import history_path, load_settings, settings_path

STYLE = Style.from_dict({"keyword": "bold ansiblue", "string": "ansigreen", "number": "ansimagenta",
                         "comment": "italic ansibrightblack"})
_TOKENS = re.compile(r"(--[^\n]*)|(\"(?:[^\"\\]|\\.)*\"?|'(?:[^'\\]|\\.)*'?)|(\d+(?:\.\d*)?)|([A-Za-z_][A-Za-z0-9_]*)|(\s+|.)")


def keywords() -> frozenset[str]:
    return frozenset(str(t.pattern.value).upper() for t in lark_parser().terminals
                     if t.pattern.type == "str" and str(t.pattern.value).replace("_", "").isalpha())


class LqlLexer(Lexer):
    def __init__(self) -> None:
        self.words = keywords()

    def lex_document(self, document: Document) -> Callable[[int], StyleAndTextTuples]:
        lines = document.lines

        def line(i: int) -> StyleAndTextTuples:
            out: StyleAndTextTuples = []
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


class _Background:
    """A value computed on a daemon thread; get() waits for it (None if computing it failed)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._done, self._value = threading.Event(), None
        threading.Thread(target=self._run, args=(fn,), daemon=True).start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._value = fn()
        finally:
            self._done.set()

    def get(self) -> Any:
        self._done.wait()
        return self._value


class LqlCompleter(Completer):
    def __init__(self, session: Session) -> None:
        self.session = session
        self._entities: tuple[Any, _Background] | None = None

    def prewarm(self) -> None:
        """Build the entity index of the vindex in use in the background (about a second for a
        262k vocabulary), so that the first Tab inside quotes does not wait for it."""
        v = self.session.vindex
        if v is not None and (self._entities is None or self._entities[0] is not v):
            self._entities = (v, _Background(lambda: vocabulary_lookup(v.tokenizer.tok.get_vocab())))

    def entities(self, partial: str) -> Iterable[str]:
        self.prewarm()
        if self._entities is None:
            return []
        lookup = self._entities[1].get()
        return lookup(partial) if lookup is not None else []

    def get_completions(self, document: Document, complete_event: Any) -> Iterable[Completion]:
        for s in complete(document.text_before_cursor, self.entities):
            yield Completion(s.text, start_position=-s.start, display_meta=s.kind)


def statement_complete(text: str) -> bool:
    """Enter submits a dot-command, a psql-style word (help, exit, quit, \\q), an empty line, or text
    ending in ';' outside quotes and comments."""
    stripped = text.strip()
    if not stripped or stripped.startswith(".") or shell_word(stripped) is not None:
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


def _history(persistent: bool) -> History:
    """The history file (repl_config.history_path), or an in-memory one when it cannot be kept."""
    if persistent:
        path = history_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return FileHistory(str(path))
        except OSError:  # a read-only home: the session still works, it just forgets
            pass
    return InMemoryHistory()


def run_repl(vindex: str | None = None, input: Any = None, output: Any = None, console: Console | None = None,
             persistent_history: bool = True, json_output: bool = False) -> int:
    """The read-eval-print loop. `input`/`output`/`console` let tests drive it through a pipe."""
    session = Session()
    state = ReplState(**load_settings(settings_path()))
    state.json = state.json or json_output
    console = console or Console()
    if vindex:
        from larql.edit.state.view import edit_vindex

        session.vindex = edit_vindex(vindex)
        print_wrapped(console, f"Using: {session.describe_backend()}")
    bars = StatementProgress(enabled=output is None)  # a test's pipe input has no terminal to draw on
    session.progress = bars.report
    completer = LqlCompleter(session)
    prompt: PromptSession[str] = PromptSession(
        message="lql> ", multiline=True, prompt_continuation="...> ", key_bindings=_bindings(),
        history=_history(persistent_history), lexer=LqlLexer(), completer=completer, style=STYLE, input=input,
        output=output, complete_while_typing=False)
    while not state.done:
        completer.prewarm()  # at the start, and after a USE / EXTRACT / .use changed the vindex
        try:
            text = prompt.prompt()
        except KeyboardInterrupt:  # Ctrl-C at the prompt clears the line
            continue
        except EOFError:  # Ctrl-D
            break
        if not text.strip():
            continue
        try:
            meta = shell_word(text) or (text if text.strip().startswith(".") else None)
            if meta is not None:
                message = META.run(meta, state, session)
                if message:
                    console.print(message, markup=False, highlight=False)
                continue
            session.source = text
            for stmt in parse(text):
                if state.plan:
                    console.print(plan(stmt, session).to_text(), markup=False, highlight=False)
                    continue
                with bars.statement(unparse(stmt)):
                    results = run_statement(stmt, session)
                for result in results:
                    if state.json:
                        render_json(result, console.file)
                    else:
                        render(result, console, timing=state.timing)
        except KeyboardInterrupt:
            console.print("statement cancelled", style="yellow")
        except LarqlError as e:
            console.print(f"{type(e).__name__}: {e}", style="red", markup=False, highlight=False)
    return 0
