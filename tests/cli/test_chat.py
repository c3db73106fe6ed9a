"""`larql run MODEL` with no prompt: the chat, driven through a real pseudo-terminal.

A `Terminal` types lines into `python -m larql run smollm2-135m` (greedy, a few tokens a reply) and
replays what it draws through the pyte terminal emulator. Each reply must be exactly what
`larql run MODEL PROMPT` prints for the same chat-templated prompt: the first turn's prompt and the
second's (the whole conversation so far), which the chat answers from its kept KV cache. Ctrl-C stops
a reply and clears a line at the prompt; Ctrl-D and /exit leave with exit code 0.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pyte
import pytest

import larql
from larql.cli.chat import Conversation, chat_template, common_prefix
from tests.cli.conftest import larql as run_larql

MODEL = "smollm2-135m"
TOKENS = "10"


def _controlling_terminal() -> None:
    """In the child: a session of its own whose controlling terminal is the pty (stdin), so that
    Ctrl-C typed there sends it SIGINT as a real terminal would — and SIGINT handled as in a terminal:
    a test run started in the background of a non-interactive shell has SIGINT ignored, and an ignored
    signal stays ignored across exec (Python then installs no KeyboardInterrupt handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """`python -m larql ARGS` on a pseudo-terminal: type into it, wait for what it prints."""

    def __init__(self, args: list[str], columns: int = 200, rows: int = 60) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(columns)}
        self.proc = subprocess.Popen([sys.executable, "-m", "larql", *args], stdin=slave, stdout=slave,
                                     stderr=slave, env=env,
                                     preexec_fn=_controlling_terminal)
        os.close(slave)
        self.master, self.raw = master, b""
        self.screen = pyte.Screen(columns, rows)
        self.stream = pyte.ByteStream(self.screen)

    def read_until(self, marker: bytes, after: int, timeout: float = 120) -> bytes:
        """Read until `marker` appears in the output after byte offset `after`; the output from there."""
        deadline = time.time() + timeout
        while marker not in self.raw[after:]:
            assert time.time() < deadline, f"no {marker!r} in {self.raw[after:]!r}"
            ready, _, _ = select.select([self.master], [], [], 1)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # the child closed the terminal
                    break
                self.raw += chunk
                self.stream.feed(chunk)
        return self.raw[after:]

    def prompt(self, after: int = 0) -> None:
        """Wait for the chat's "> " prompt at the start of a line, after byte offset `after`."""
        self.read_until(b"\n> ", after)

    def send(self, text: str) -> int:
        at = len(self.raw)
        os.write(self.master, text.encode())
        return at

    def lines(self) -> list[str]:
        return [line.rstrip() for line in self.screen.display if line.strip()]

    def close(self) -> int:
        """Wait for the child to exit (reading what it still prints); its exit code."""
        rc = self.proc.wait(timeout=60)
        while select.select([self.master], [], [], 0.2)[0]:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                break
            if not chunk:
                break
            self.raw += chunk
            self.stream.feed(chunk)
        os.close(self.master)
        return rc


@pytest.fixture(scope="module")
def smol() -> larql.Model:
    return larql.load(MODEL)


def run_prompt(model: larql.Model, messages: list[dict[str, str]]) -> str:
    """What `larql run MODEL PROMPT` prints after the prompt, for the chat-templated `messages`."""
    template = chat_template(model)
    assert template is not None and template.origin.startswith("gguf")
    ids = template.render(model, messages)
    text = model.detokenize(ids)
    assert model.tokenize(text) == ids  # the same prompt, as text on the command line
    r = run_larql("run", MODEL, text, "--max-tokens", TOKENS)
    assert r.returncode == 0 and r.stdout.startswith(text), r.stderr
    return r.stdout[len(text):].rstrip("\n").removesuffix("<|im_end|>")


def test_chat_replies_equal_larql_run_on_the_templated_prompt(smol: larql.Model) -> None:
    term = Terminal(["run", MODEL, "--max-tokens", TOKENS, "--stats"])
    term.prompt()
    answers = []
    for question in ("What is the capital of France?", "And of Germany?"):
        at = term.send(question + "\r")
        out = term.read_until(b"\n> ", at + len(question) + 2)  # past the echoed line, to the next prompt
        answers.append(out.decode())
    term.send("\x04")  # Ctrl-D
    assert term.close() == 0
    screen = term.lines()
    first = run_prompt(smol, [{"role": "user", "content": "What is the capital of France?"}])
    second = run_prompt(smol, [{"role": "user", "content": "What is the capital of France?"},
                               {"role": "assistant", "content": first},
                               {"role": "user", "content": "And of Germany?"}])
    assert first and second
    at = screen.index("> What is the capital of France?")
    assert screen[at + 1] == first
    assert screen[at + 2].startswith("[") and "0 from the cache]" in screen[at + 2]
    assert screen[at + 3] == "> And of Germany?"
    assert screen[at + 4] == second
    reused = int(screen[at + 5].split("run, ")[1].split()[0])
    assert reused > 30  # the second turn ran only its new tokens: the first turn's came from the cache
    assert "chat template: gguf" in screen[0] and "/reset" in screen[0]


def test_ctrl_c_stops_a_reply_and_clears_a_line_then_reset_and_exit() -> None:
    term = Terminal(["run", MODEL, "--max-tokens", "400"])
    term.prompt()
    question = "Count from 1 to 200."
    at = term.send(question + "\r")
    term.read_until(b"2", at + len(question) + 2, timeout=120)  # the reply has started (it runs to 20 lines)
    term.send("\x03")
    term.read_until(b"[stopped]", at, timeout=120)
    term.prompt(term.raw.index(b"[stopped]"))
    time.sleep(1)  # a SIGINT in the instant before input() waits for a key is seen only at the next key (CPython)
    at = term.send("half a line\x03")  # Ctrl-C at the prompt drops the line (the terminal discards it unread)
    term.prompt(at)
    at = term.send("/reset\r")
    term.read_until(b"(conversation cleared)", at)
    at = term.send("/exit\r")
    assert term.close() == 0
    screen = term.lines()
    stopped = screen.index(next(line for line in screen if line.endswith("[stopped]")))
    assert screen[1] == f"> {question}" and screen[2].startswith("1") and stopped < 22
    assert screen[stopped + 1:] == [">", "> /reset", "(conversation cleared)", "> /exit"]


def test_conversation_keeps_its_cache_and_cuts_it_back_exactly(smol: larql.Model) -> None:
    """In process: a turn runs only what the cache lacks; a reset empties it; the cache's ids stay a
    prefix of the conversation's."""
    from larql.model.generate import SamplingParams

    talk = Conversation(smol, chat_template(smol))
    greedy = SamplingParams()
    one = "".join(talk.reply("What is the capital of France?", greedy, 6))
    assert talk.last.reused == 0 and talk.last.generated == 6
    assert talk.messages[-1] == {"role": "assistant", "content": one}
    asked = talk.template.render(smol, [*talk.messages, {"role": "user", "content": "And of Germany?"}])
    assert common_prefix(talk.cached, asked) > 30  # the first turn's prompt and most of its reply
    "".join(talk.reply("And of Germany?", greedy, 4))
    assert talk.last.reused > 30 and talk.last.prefilled == len(asked) - talk.last.reused
    assert talk.cached[:len(asked)] == asked and talk.cache.length == len(talk.cached) == len(asked) + 3
    talk.reset()
    assert talk.messages == [] and talk.cache.length == 0
    reply = talk.reply("What is the capital of France?", greedy, 20)
    first = next(reply)
    reply.close()  # what Ctrl-C does to a reply mid-way: the part shown stays
    assert talk.last.stopped and talk.messages[-1] == {"role": "assistant", "content": first}
    assert talk.cache.length == len(talk.cached) and talk.cached == talk.prompt_ids()[:len(talk.cached)]


def test_plain_continuation_without_a_template(tiny_gguf: Path) -> None:
    """A model with no chat template and no turn markers continues the text as typed."""
    model = larql.load(str(tiny_gguf))
    assert chat_template(model) is None
    term = Terminal(["run", str(tiny_gguf), "--max-tokens", "4"])
    term.prompt()
    at = term.send("abc\r")
    out = term.read_until(b"\r\n> ", at)
    term.send("\x04")
    assert term.close() == 0
    assert "plain continuation" in term.lines()[0]
    reply = out.decode().removeprefix("abc\r\n").removesuffix("\r\n> ")
    expected = run_larql("run", str(tiny_gguf), "abc\n", "--max-tokens", "4").stdout.removeprefix("abc\n")
    assert reply and reply == expected.removesuffix("\n").replace("\n", "\r\n")


def test_top_and_json_need_a_prompt(tiny_gguf: Path) -> None:
    for flag in ("--top", "--json"):
        r = run_larql("run", str(tiny_gguf), *([flag, "3"] if flag == "--top" else [flag]))
        assert r.returncode == 2 and "need a prompt" in r.stderr
