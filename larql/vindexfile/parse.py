"""The Vindexfile: a line-based recipe for a vindex (vindex_spec/VINDEXFILE.md).

    FROM gemma3-270m                 # a vindex, an alias, a .gguf file, an HF directory or a Hub id
    PATCH "facts.vlp"
    INSERT ("France", "capital", "Rome")
    DELETE entity = "Paris" AND relation = "capital"
    LABELS "labels.json"
    EXPOSE browse
    STAGE prod

Parsing does no work and reads no file: every error it can find (an unknown instruction, a
missing argument, an LQL line that does not parse, a second FROM) is raised before the build
starts, as `Vindexfile:LINE: message`, so a typo on line 5 cannot leave half a build behind.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from larql.errors import BuildError, LqlError
from larql.lql import ast
from larql.lql.parser import parse

KEYWORDS = ("FROM", "PATCH", "INSERT", "DELETE", "LABELS", "EXPOSE", "STAGE")
LEVELS = ("browse", "inference", "all")  # what EXPOSE keeps, smallest first
_STAGE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
# LARQL's short forms, rewritten into the LQL statements they stand for
_SHORT_INSERT = re.compile(r"^\(.*\)$", re.S)
_SHORT_DELETE = re.compile(r"^(?!FROM\b)", re.I)


@dataclass(frozen=True)
class Instruction:
    line: int  # 1-based line in the Vindexfile (the first line of a continued instruction)
    keyword: str  # one of KEYWORDS, upper case
    arg: str  # the path (unquoted), the LQL statement, the EXPOSE level or the stage name
    stage: str | None  # the STAGE it belongs to; None before the first STAGE
    statement: ast.Statement | None = None  # INSERT / DELETE: the parsed LQL

    @property
    def text(self) -> str:
        return f"{self.keyword} {self.arg}"


@dataclass(frozen=True)
class Vindexfile:
    path: Path
    instructions: tuple[Instruction, ...]

    @property
    def stages(self) -> tuple[str, ...]:
        return tuple(i.arg for i in self.instructions if i.keyword == "STAGE")

    def select(self, stage: str | None = None) -> tuple[Instruction, ...]:
        """The instructions a build runs: all of them, or those up to the end of `stage`
        (stages run in file order; each builds on the ones before it)."""
        if stage is None:
            return self.instructions
        if stage not in self.stages:
            known = ", ".join(self.stages) or "none defined"
            raise BuildError(f"{self.path}: no STAGE {stage!r} (stages: {known})")
        last = max(n for n, i in enumerate(self.instructions) if i.stage == stage)
        return self.instructions[: last + 1]


def _fail(path: Path, line: int, message: str) -> BuildError:
    return BuildError(f"{path.name}:{line}: {message}")


def _unquote(path: Path, line: int, keyword: str, arg: str) -> str:
    if not arg:
        raise _fail(path, line, f'{keyword} needs a path, e.g. {keyword} "{_EXAMPLE[keyword]}"')
    if arg[0] in "\"'":
        if len(arg) < 2 or arg[-1] != arg[0]:
            raise _fail(path, line, f"{keyword}: unterminated quoted path {arg}")
        return arg[1:-1]
    if len(arg.split()) > 1:
        raise _fail(path, line, f'{keyword} takes one path; quote a path with spaces: {keyword} "{arg}"')
    return arg


_EXAMPLE = {"FROM": "base.vindex", "PATCH": "facts.vlp", "LABELS": "labels.json"}


def _lql(path: Path, line: int, keyword: str, arg: str) -> tuple[str, ast.Statement]:
    """The LQL statement of an INSERT / DELETE line (LARQL's short forms expanded), parsed."""
    if keyword == "INSERT" and _SHORT_INSERT.match(arg):
        text = f"INSERT INTO EDGES (entity, relation, target) VALUES {arg}"
    elif keyword == "DELETE" and arg and _SHORT_DELETE.match(arg):
        text = f"DELETE FROM EDGES WHERE {arg}"
    else:
        text = f"{keyword} {arg}"
    try:
        stmts = parse(text)
    except LqlError as e:
        raise _fail(path, line, f"{keyword}: {e.message}" + (f" ({e.hint})" if e.hint else "")) from e
    if len(stmts) != 1 or not isinstance(stmts[0], ast.InsertStmt | ast.DeleteStmt):
        raise _fail(path, line, f"{keyword} takes one LQL {keyword} statement, e.g. "
                    + ('INSERT ("France", "capital", "Rome")' if keyword == "INSERT"
                       else 'DELETE entity = "Paris" AND relation = "capital"'))
    return text, stmts[0]


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, content) with comments stripped and `\\`-continued lines joined."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw).strip()
        if pending is not None:
            line = f"{pending[1]} {line}".strip()
            n = pending[0]
            pending = None
        if line.endswith("\\"):
            pending = (n, line[:-1].rstrip())
            continue
        if line:
            out.append((n, line))
    if pending is not None and pending[1]:
        out.append(pending)
    return out


def _strip_comment(line: str) -> str:
    """The line up to a `#` that is outside quotes (a quoted path or entity may hold one)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[:i]
    return line


def parse_vindexfile(text: str, path: str | Path = "Vindexfile") -> Vindexfile:
    """Parse a Vindexfile's text; raises BuildError naming the line at fault."""
    path = Path(path)
    out: list[Instruction] = []
    stage: str | None = None
    for n, line in _logical_lines(text):
        word, _, arg = line.partition(" ")
        keyword, arg = word.upper(), arg.strip()
        if keyword not in KEYWORDS:
            near = difflib.get_close_matches(keyword, KEYWORDS, n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]}?" if near else f" (instructions: {', '.join(KEYWORDS)})"
            raise _fail(path, n, f"unknown instruction {word!r}{hint}".replace("'", '"'))
        if keyword == "FROM":
            if out:
                raise _fail(path, n, f"FROM must be the first instruction, and there is only one (line "
                            f"{out[0].line} already has {out[0].keyword})")
        elif not out:
            raise _fail(path, n, f"{keyword} before FROM: a Vindexfile starts with FROM <vindex or model>")
        stmt = None
        if keyword in ("FROM", "PATCH", "LABELS"):
            arg = _unquote(path, n, keyword, arg)
        elif keyword in ("INSERT", "DELETE"):
            arg, stmt = _lql(path, n, keyword, arg)
            arg = arg.partition(" ")[2]
        elif keyword == "EXPOSE":
            arg = _level(path, n, arg)
        else:  # STAGE
            if not _STAGE_NAME.match(arg):
                raise _fail(path, n, f"STAGE needs a name of letters, digits, '_', '-' or '.', got {arg!r}")
            if arg in (i.arg for i in out if i.keyword == "STAGE"):
                raise _fail(path, n, f"STAGE {arg} is defined twice")
            stage = arg
        out.append(Instruction(n, keyword, arg, stage, stmt))
    if not out:
        raise BuildError(f"{path}: empty; a Vindexfile starts with FROM <vindex or model>")
    return Vindexfile(path, tuple(out))


def _level(path: Path, line: int, arg: str) -> str:
    """EXPOSE's level; LARQL lists several (`EXPOSE browse inference`): the largest one wins."""
    words = [w.lower() for w in arg.replace(",", " ").split()]
    if not words:
        raise _fail(path, line, f"EXPOSE needs a level: {' | '.join(LEVELS)}")
    for w in words:
        if w not in LEVELS:
            near = difflib.get_close_matches(w, LEVELS, n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]}?" if near else f" (levels: {', '.join(LEVELS)})"
            raise _fail(path, line, f'unknown EXPOSE level "{w}"{hint}')
    return max(words, key=LEVELS.index)


def read_vindexfile(directory: str | Path) -> Vindexfile:
    """The Vindexfile in `directory` (or the file itself when given one), parsed."""
    p = Path(directory)
    file = p / "Vindexfile" if p.is_dir() else p
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BuildError(f"{file}: no Vindexfile here; write one (vindex_spec/VINDEXFILE.md), "
                         f"starting with FROM <vindex or model>") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BuildError(f"{file}: cannot read the Vindexfile ({e})") from e
    return parse_vindexfile(text, file)
