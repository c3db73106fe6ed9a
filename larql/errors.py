"""The larql error hierarchy. Every error a user can cause is one of these.

Each error renders as one line that names the thing at fault (a file, a tensor, an alias) and how
to fix it. The CLI prints `str(err)` and exits non-zero; tracebacks appear only with `--debug`.

    LarqlError
    ├── ModelError              loading or running a model
    │   ├── ModelFormatError    a model file is missing, truncated or corrupt (also a ValueError)
    │   ├── UnsupportedError    an architecture, quant type or feature we do not handle
    │   ├── ContextLengthError  a prompt longer than the model's context
    │   └── EmptyTargetError    a target token text that tokenizes to nothing (also a ValueError)
    ├── QuantError              a quant kernel got data of the wrong type, shape or size
    ├── TokenizerError          a tokenizer cannot be built from the metadata given
    ├── VindexError             a vindex is missing, damaged, or asked for something it lacks
    ├── EditError               an edit that cannot be made (bad fact, target, edit set, or goal not reachable)
    ├── BuildError              a Vindexfile that does not parse, or a `larql build` step that fails
    ├── LqlError                an LQL statement at fault; renders line:column, the line and a caret
    │   ├── LqlSyntaxError      it does not parse
    │   └── LqlSemanticError    it parses but cannot run here (no vindex in use, layer out of range...)
    ├── UnknownModelError       an alias or path that names no model (also a LookupError)
    └── ServeError              a request `larql serve` refuses, or a server `USE REMOTE` cannot use
        ├── AccessError         a write to a read-only server, a missing or wrong token (401 or 403)
        ├── LimitError          a request over one of the server's limits (size, statements, tokens, time)
        └── RemoteError         a server that cannot be reached or answers something that is not larql's
"""

from __future__ import annotations

__all__ = ["AccessError", "BuildError", "ContextLengthError", "EditError", "EmptyTargetError", "LarqlError", "LimitError", "LqlError", "LqlSemanticError", "LqlSyntaxError", "ModelError", "ModelFormatError", "QuantError", "RemoteError", "ServeError", "TokenizerError", "UnknownModelError", "UnsupportedError", "VindexError"]

class LarqlError(Exception):
    """Base of every error larql raises on purpose."""


class ModelError(LarqlError):
    """Loading or running a model failed."""


class ModelFormatError(ModelError, ValueError):
    """A model file is missing, truncated or corrupt."""


class UnsupportedError(ModelError):
    """An architecture, quant type or option that larql does not support."""


class ContextLengthError(ModelError, ValueError):
    """A prompt (plus the tokens to generate) does not fit in the model's context."""


class EmptyTargetError(ModelError, ValueError):
    """A target (of TRACE FOR, INSERT, UPDATE ...) whose text tokenizes to no token at all."""


class QuantError(LarqlError, ValueError):
    """A quant kernel was given data of the wrong dtype, shape or byte size."""


class TokenizerError(LarqlError):
    """A tokenizer could not be built or used."""


class VindexError(LarqlError, ValueError):
    """A vindex is missing, truncated, corrupt, or lacks what an operation needs."""


class EditError(LarqlError, ValueError):
    """A fact edit that cannot be made as asked: a bad fact, target or edit-set file, non-finite
    numbers, or statistics that cannot be computed. Nothing is half-applied when it is raised."""


class BuildError(LarqlError, ValueError):
    """A Vindexfile at fault (rendered `Vindexfile:LINE: message`) or a build step that failed.
    Nothing is written to the build's output when it is raised."""


class LqlError(LarqlError):
    """An error located in LQL source text."""

    def __init__(self, message: str, text: str = "", line: int = 0, column: int = 0, hint: str = "") -> None:
        self.message, self.text, self.line, self.column, self.hint = message, text, line, column, hint
        super().__init__(self.render())

    @property
    def source_line(self) -> str:
        lines = self.text.splitlines() or [""]
        return lines[self.line - 1] if 0 < self.line <= len(lines) else ""

    def render(self) -> str:
        """`line:col: message`, then the source line and a caret under the column (when known)."""
        if not self.line:
            return self.message + (f" ({self.hint})" if self.hint else "")
        head = f"{self.line}:{self.column}: {self.message}"
        if self.hint:
            head += f"\n  hint: {self.hint}"
        line, caret = self.source_line, self.column - 1
        if len(line) > 120:  # a long line is shown around the column only
            start = max(0, caret - 60)
            line = ("..." if start else "") + line[start:start + 120] + ("..." if start + 120 < len(line) else "")
            caret += (3 if start else 0) - start
        return f"{head}\n  {line}\n  {' ' * caret}^"


class LqlSyntaxError(LqlError):
    """LQL text that does not parse."""


class LqlSemanticError(LqlError):
    """A statement that parses but cannot run in this session."""


class UnknownModelError(LarqlError, LookupError):
    """A model alias or path that names nothing larql can load."""


class ServeError(LarqlError):
    """A request the server refuses, or a server a client cannot use. `status` is the HTTP status
    the server answers it with (the client side keeps the status the server sent)."""

    status = 400

    def __init__(self, message: str, status: int | None = None, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        self.param, self.code = param, code  # the request field at fault and a short code, for OpenAI's error shape


class AccessError(ServeError):
    """A write statement on a read-only server (403), or without the server's token (401)."""

    status = 403


class LimitError(ServeError):
    """A request over one of the server's limits: body size, statements, tokens or time."""

    status = 413


class RemoteError(ServeError):
    """A larql server that cannot be reached, or that answered something other than larql's JSON."""

    status = 502
