"""A seeded mutation fuzzer for LQL: mutated fixture statements and grammar tokens.

Every input must either parse or raise an `LqlError`, within a time bound; the executor, given
the mutated statements that parse, must raise nothing but `LarqlError`s.

    python -m tests.fuzz.lql_fuzz --count 60000 --seed 1      # the long run (parser only)

prints the number of inputs, the failures by exception type (with one example each), and the
slowest parses. The CI test (tests/fuzz/test_lql_fuzz.py) runs a few thousand with a fixed seed.
"""

from __future__ import annotations

import argparse
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from larql.errors import LarqlError, LqlError

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "lql"
GRAMMAR = ROOT / "grammar" / "lql.lark"


def fixture_statements() -> list[str]:
    """The fixture statements and the sources of the golden error cases."""
    text = (GOLDEN / "statements.lql").read_text()
    out = [ln.rstrip().rstrip(";") for ln in text.splitlines() if ln.strip() and not ln.startswith("--")]
    for block in (GOLDEN / "errors.txt").read_text().split("\n=====\n"):
        if block.strip():
            out.append(block.split("\n-----\n")[0])
    return out


def grammar_tokens() -> list[str]:
    """Keywords and punctuation of the grammar, plus literals of each terminal type."""
    text = GRAMMAR.read_text()
    keywords = re.findall(r'^[A-Z_]+: "([A-Z_]+)"i$', text, re.MULTILINE)
    punct = sorted(set(re.findall(r'"([^A-Za-z"\s]+)"', text)))
    return keywords + punct + ['"x"', "'y'", "1", "0", "-3", "2.5", ".5", "0-3", "field", "--", "\n"]


# characters that stress lexing and decoding: quotes, escapes, controls, NUL, surrogates, wide chars
SPECIAL_CHARS = ['"', "'", "\\", "\x00", "\ud800", "\udfff", "\n", "\r", "\t", "\x0b", "\x0c", "\x1b", "\x7f",
                 "\u2028", "\ufeff", "é", "☃", "\U0001f600", ";", "-", "|", ">", "(", ")", ",", "=", "*", "."]
ESCAPES = ["\\N{NOPE}", "\\N{LATIN SMALL LETTER E}", "\\x4", "\\x41", "\\u12", "\\u0041", "\\ud800", "\\udc00",
           "\\ud83d\\ude00", "\\U0001F600", "\\U00110000", "\\0", "\\00", "\\q", "\\", "\\\\", "\\'", '\\"',
           "\\n", "\\t", "\\r", "\\u0000", "\\\n", "\\a", "\\b", "\\f", "\\v", "\\{", "\\u{41}"]
NUMBERS = ["9" * 17, "9" * 20, "9" * 400, "9" * 5000, "1" + "0" * 308, "1" + "0" * 309 + ".5", "0." + "0" * 400 + "1",
           "-" + "9" * 30, "2147483648", "9007199254740993", "1e400", "1.5e3", "00000000000000000000001", "-0", "-0.0"]
LONG_RUNS = ["'", '"', "\\", "-", "(", "a", "9", " ", "\n", ";", "é", "\x00", "''", '""', "\\'", '\\"', "|>", "-1"]


def _rand_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(SPECIAL_CHARS) if rng.random() < 0.3 else chr(rng.randrange(32, 127)) for _ in range(n))


class Mutator:
    """Mutations of seed statements; each call to `one()` returns a new input."""

    def __init__(self, seeds: list[str], tokens: list[str], rng: random.Random) -> None:
        self.seeds, self.tokens, self.rng = seeds, tokens, rng
        self.ops: list[Callable[[str], str]] = [
            self.insert_char, self.delete_span, self.duplicate_span, self.insert_token, self.replace_token,
            self.insert_number, self.insert_run, self.insert_escape, self.splice, self.swap, self.long_string,
            self.random_text, self.swap_quotes, self.truncate]

    def _pos(self, s: str) -> int:
        return self.rng.randint(0, len(s))

    def _big(self) -> int:
        """A length that is usually small and sometimes very long."""
        return self.rng.choice([2, 3, 5, 10, 50, 64, 65, 129, 255, 256, 300, 1000, 4097, 5000, 70000])

    def insert_char(self, s: str) -> str:
        p = self._pos(s)
        c = self.rng.choice(SPECIAL_CHARS) if self.rng.random() < 0.7 else chr(self.rng.randrange(0x20, 0x3000))
        return s[:p] + c + s[p:]

    def delete_span(self, s: str) -> str:
        p = self._pos(s)
        return s[:p] + s[p + self.rng.randint(1, 8):]

    def duplicate_span(self, s: str) -> str:
        p = self._pos(s)
        span = s[p:p + self.rng.randint(1, 12)]
        return s[:p] + span * self.rng.choice([2, 3, 10, 100, self._big()]) + s[p:]

    def insert_token(self, s: str) -> str:
        p = self._pos(s)
        return s[:p] + self.rng.choice(["", " "]) + self.rng.choice(self.tokens) + self.rng.choice(["", " "]) + s[p:]

    def replace_token(self, s: str) -> str:
        words = re.split(r"(\s+)", s)
        i = self.rng.randrange(len(words))
        words[i] = self.rng.choice(self.tokens)
        return "".join(words)

    def insert_number(self, s: str) -> str:
        numbers = list(re.finditer(r"-?\d+(\.\d*)?", s))
        big = self.rng.choice(NUMBERS)
        if numbers and self.rng.random() < 0.7:
            m = self.rng.choice(numbers)
            return s[:m.start()] + big + s[m.end():]
        p = self._pos(s)
        return s[:p] + " " + big + " " + s[p:]

    def insert_run(self, s: str) -> str:
        p = self._pos(s)
        return s[:p] + self.rng.choice(LONG_RUNS) * self._big() + s[p:]

    def insert_escape(self, s: str) -> str:
        quotes = [m.start() + 1 for m in re.finditer(r"[\"']", s)]
        p = self.rng.choice(quotes) if quotes and self.rng.random() < 0.8 else self._pos(s)
        return s[:p] + self.rng.choice(ESCAPES) + s[p:]

    def splice(self, s: str) -> str:
        other = self.rng.choice(self.seeds)
        return s[:self._pos(s)] + self.rng.choice(["", ";", " ", " |> "]) + other[self.rng.randint(0, len(other)):]

    def swap(self, s: str) -> str:
        if len(s) < 2:
            return s
        i, j = sorted(self.rng.sample(range(len(s)), 2))
        return s[:i] + s[j] + s[i + 1:j] + s[i] + s[j + 1:]

    def long_string(self, s: str) -> str:
        """Replace one string literal's body by a long one (a long path, prompt or entity)."""
        strings = list(re.finditer(r'"[^"\n]*"|\'[^\'\n]*\'', s))
        n = self._big()
        body = (self.rng.choice(["x", "a/", "é", "\\\\", "ab/" * 40 + "c"]) * n)[:n]
        if not strings:
            return s + f' "{body}"'
        m = self.rng.choice(strings)
        return s[:m.start()] + '"' + body + '"' + s[m.end():]

    def random_text(self, s: str) -> str:
        p = self._pos(s)
        return s[:p] + _rand_text(self.rng, self.rng.randint(1, 30)) + s[p:]

    def swap_quotes(self, s: str) -> str:
        return s.translate(str.maketrans({'"': "'", "'": '"'})) if self.rng.random() < 0.5 else s.replace('"', "", 1)

    def truncate(self, s: str) -> str:
        return s[:self._pos(s)]

    def one(self) -> str:
        s = self.rng.choice(self.seeds)
        for _ in range(self.rng.choice([1, 1, 1, 2, 2, 3, 4])):
            s = self.rng.choice(self.ops)(s)[:300_000]  # a little over the parser's input limit
        return s


# statements that run on a tiny vindex ({vx}); mutated for the executor fuzz
EXECUTOR_SEEDS = [
    'USE "{vx}"', "STATS", 'STATS "{vx}"', "SHOW LAYERS", "SHOW LAYERS 0-2", "SHOW FEATURES 1 LIMIT 3",
    "SHOW ENTITIES AT LAYER 1 LIMIT 3", "SHOW RELATIONS", "SHOW MODELS", "SHOW PATCHES",
    'DESCRIBE "hello" VERBOSE', 'DESCRIBE "abc" AT LAYER 2 RELATIONS ONLY', 'WALK "hello" TOP 2 LAYERS 1-2',
    'EXPLAIN WALK "hello" VERBOSE TOP 2', "SELECT * FROM EDGES WHERE layer = 2 AND score > 0 ORDER BY score DESC LIMIT 5",
    'SELECT * FROM EDGES NEAREST TO "abc" AT LAYER 1 LIMIT 4', "SELECT * FROM FEATURES WHERE layer = 0 AND feature IN (3, 5)",
    'SELECT entity, target FROM EDGES WHERE token LIKE "a%" LIMIT 3', "SELECT * FROM ENTITIES LIMIT 3",
    'INFER "hello" TOP 3', 'EXPLAIN INFER "hello" TOP 2 WITH ATTENTION', 'TRACE "hello" FOR "x" SAVE "t.json"',
    "DELETE FROM EDGES WHERE layer = 1 AND feature = 3", 'UPDATE EDGES SET target = "x" WHERE layer = 1 AND feature = 2',
    'BEGIN PATCH "p.vlp"', "SAVE PATCH", 'APPLY PATCH "p.vlp"', 'REMOVE PATCH "p.vlp"',
    'BEGIN PATCH "p.vlp"; DELETE FROM EDGES WHERE layer = 0 AND feature = 1; SAVE PATCH; APPLY PATCH "p.vlp"',
    'WALK "a" |> INFER "b" TOP 2', 'MERGE "{vx}"', 'DIFF CURRENT "{vx}"', 'CROWN "hello" FOR "x" SUBJECT "hello"',
    'DELETE FROM EDGES WHERE layer = 1 AND feature = 4; COMPACT MINOR; SHOW COMPACT STATUS; COMPACT',
    'BEGIN PATCH "m.vlp"; UPDATE EDGES SET confidence = 0.2 WHERE layer = 0 AND feature = 1; SAVE PATCH; MERGE "m.vlp" ON CONFLICT FAIL',
    'REBALANCE AT LAYER 1 MAX 2',
    'TRACE "hello" POSITIONS ALL SAVE "t.trace" FORCE', 'DIFF CURRENT "{vx}" INTO PATCH "d.vlp" FORCE',
    'BEGIN PATCH "q.vlp" FORCE; DELETE FROM EDGES WHERE layer = 2 AND feature = 1; SAVE PATCH FORCE',
    'BEGIN PATCH "{vx}/x.vlp"', 'DIFF CURRENT "{vx}" INTO PATCH "{vx}/../x.vlp"',
]
# too slow for a fuzz loop (a real model, an extraction, an optimisation) or writing big files
SLOW_STATEMENTS = ("ExtractStmt", "InsertStmt", "CompileStmt")


def mutations(count: int, seed: int = 0, seeds: list[str] | None = None) -> Iterator[str]:
    """`count` mutated inputs, the same ones for the same seed."""
    m = Mutator(seeds or fixture_statements(), grammar_tokens(), random.Random(seed))
    for _ in range(count):
        yield m.one()


class Report:
    def __init__(self) -> None:
        self.inputs = self.parsed = self.rejected = 0
        self.failures: Counter[str] = Counter()
        self.examples: dict[str, str] = {}
        self.times: list[tuple[float, str]] = []

    def fail(self, kind: str, text: str) -> None:
        self.failures[kind] += 1
        self.examples.setdefault(kind, text)

    @property
    def max_time(self) -> float:
        return max((t for t, _ in self.times), default=0.0)

    def slowest(self, n: int = 5) -> list[tuple[float, str]]:
        return sorted(self.times, reverse=True)[:n]


def fuzz_parser(inputs: Iterator[str]) -> Report:
    """Parse every input; record non-LqlError exceptions and the time each parse took."""
    from larql.lql import parse

    parse("STATS")  # build the parser outside the timings
    r = Report()
    for text in inputs:
        r.inputs += 1
        t0 = time.perf_counter()
        try:
            parse(text)
            r.parsed += 1
        except LqlError as e:
            r.rejected += 1
            try:
                str(e)  # rendering must not fail either
            except Exception as e2:
                r.fail(f"render {type(e2).__name__}", text)
        except Exception as e:
            r.fail(type(e).__name__ + (f"[{type(e.orig_exc).__name__}]" if hasattr(e, "orig_exc") else ""), text)
        r.times.append((time.perf_counter() - t0, text))
    return r


def fuzz_executor(inputs: Iterator[str], session: Callable[[], object]) -> Report:
    """Run each input that parses (and holds no slow statement) in a fresh session; record
    exceptions that are not LarqlErrors. USE MODEL only opens files that exist already."""
    from larql.lql import ast
    from larql.lql.executor import execute
    from larql.lql.parser import parse

    r = Report()
    for text in inputs:
        try:
            statements = parse(text)
        except LqlError:
            continue
        stages = [x for s in statements for x in (s.stages if isinstance(s, ast.PipeStmt) else (s,))]
        if any(type(x).__name__ in SLOW_STATEMENTS or (isinstance(x, ast.UseStmt) and x.kind == "model"
                                                       and not Path(x.target).is_file()) for x in stages):
            continue
        r.inputs += 1
        t0 = time.perf_counter()
        try:
            execute(text, session())  # type: ignore[arg-type]
            r.parsed += 1
        except LarqlError as e:
            r.rejected += 1
            str(e)
        except Exception as e:
            r.fail(f"{type(e).__name__}: {str(e)[:80]}", text)
        r.times.append((time.perf_counter() - t0, text))
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=60000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    t0 = time.perf_counter()
    r = fuzz_parser(mutations(args.count, args.seed))
    print(f"{r.inputs} inputs in {time.perf_counter() - t0:.1f} s: {r.parsed} parsed, {r.rejected} LqlError, "
          f"{sum(r.failures.values())} other exceptions")
    for kind, n in r.failures.most_common():
        print(f"  {n:6d} {kind}: {r.examples[kind][:160]!r}")
    slow = [t for t, _ in r.times if t > 0.1]
    print(f"max parse {r.max_time * 1e3:.1f} ms; {len(slow)} over 100 ms")
    for t, text in r.slowest():
        print(f"  {t * 1e3:8.1f} ms  len {len(text)}: {text[:120]!r}")


if __name__ == "__main__":
    main()
