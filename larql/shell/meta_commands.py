"""REPL dot-commands, registered with a decorator; `.help` is generated from the registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from larql.errors import LarqlError
from larql.lql import reference


@dataclass
class ReplState:
    json: bool = False
    timing: bool = False
    plan: bool = False
    done: bool = False
    output: list[str] = field(default_factory=list)


Handler = Callable[["ReplState", str, object], str]


@dataclass(frozen=True)
class MetaCommand:
    name: str
    usage: str
    help: str
    handler: Handler


class Registry:
    def __init__(self) -> None:
        self.commands: dict[str, MetaCommand] = {}

    def command(self, name: str, usage: str, help: str) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            self.commands[name] = MetaCommand(name, usage, help, fn)
            return fn

        return register

    def run(self, line: str, state: ReplState, session: object) -> str:
        name, _, arg = line.strip().partition(" ")
        cmd = self.commands.get(name)
        if cmd is None:
            raise LarqlError(f"unknown command {name} (type .help for the list)")
        return cmd.handler(state, arg.strip(), session)


META = Registry()


def _toggle(current: bool, arg: str, what: str) -> bool:
    if arg.lower() in ("on", "off"):
        return arg.lower() == "on"
    if arg:
        raise LarqlError(f".{what} takes on or off, not {arg!r}")
    return not current


@META.command(".help", ".help [STATEMENT]", "every statement with an example; one statement's syntax")
def _help(state: ReplState, arg: str, session: object) -> str:
    if arg:
        found = reference.detail(arg)
        if found is None:
            raise LarqlError(f"no statement called {arg!r}; .help lists them all")
        return found
    width = max(len(c.usage) for c in META.commands.values())
    commands = "\n".join(f"  {c.usage:<{width}}  {c.help}" for c in META.commands.values())
    return f"{reference.overview()}\n\nCommands (no ';'; help, exit, quit and \\q work too):\n{commands}"


# what psql/litecli users type: help, exit, quit, \q, with or without ';'
_SHELL_WORDS = {"help": ".help", "\\?": ".help", "\\h": ".help", "exit": ".quit", "quit": ".quit", "\\q": ".quit"}


def shell_word(text: str) -> str | None:
    """The dot-command a psql-style word stands for (`help describe;` -> `.help describe`), or None."""
    words = text.strip().rstrip(";").split(None, 1)
    if not words or "\n" in text.strip() or words[0].lower() not in _SHELL_WORDS:
        return None
    command = _SHELL_WORDS[words[0].lower()]
    if len(words) > 1 and command != ".help":
        return None  # "exit now" is not the exit command
    return " ".join([command, *words[1:]])


def _register_toggle(attr: str, help: str) -> None:
    @META.command(f".{attr}", f".{attr} [on|off]", help)
    def toggle(state: ReplState, arg: str, session: object) -> str:
        setattr(state, attr, _toggle(getattr(state, attr), arg, attr))
        return f"{attr} {'on' if getattr(state, attr) else 'off'}"


_register_toggle("json", "print results as JSON instead of tables")
_register_toggle("timing", "print how long each statement took")
_register_toggle("plan", "print each statement's plan instead of running it")


@META.command(".use", ".use PATH", "open a vindex (same as USE \"PATH\";)")
def _use(state: ReplState, arg: str, session: object) -> str:
    from larql.edit.state.view import edit_vindex

    if not arg:
        raise LarqlError(".use needs a vindex path")
    session.vindex = edit_vindex(arg)  # type: ignore[attr-defined]
    return f"Using: {session.describe_backend()}"  # type: ignore[attr-defined]


@META.command(".quit", ".quit", "leave the REPL (Ctrl-D does too)")
def _quit(state: ReplState, arg: str, session: object) -> str:
    state.done = True
    return ""
