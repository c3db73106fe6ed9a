"""The statement reference behind the REPL's `.help` and `help`: each statement's syntax (as
grammar/lql.lark accepts it), one example and what it does.

A test checks that every statement kind of the grammar has an entry here and that each example
parses to that kind, so this cannot drift from the grammar unnoticed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StatementHelp:
    name: str  # the leading keywords, as `.help NAME` takes them
    syntax: str  # [optional] {one | other} ... repeats
    example: str
    summary: str
    implemented: bool = True


STATEMENTS: tuple[StatementHelp, ...] = (
    StatementHelp("USE", 'USE "path.vindex" | USE MODEL "alias|file.gguf|hf-dir" | USE REMOTE "http://host:port"',
                  'USE "g.vindex";', "open a vindex (or load a model) for the statements after it; REMOTE: send "
                  "them to a `larql serve`"),
    StatementHelp("USE SAE", 'USE SAE "dir" [AT LAYER n] [LABELS "explanations.json"]',
                  'USE SAE "saes/blocks.6.hook_resid_post" AT LAYER 6;',
                  "attach a sparse autoencoder (SAELens' format) at the hook point its cfg.json names, or a "
                  "transcoder at the MLP it stands in for: EXPLAIN INFER and DESCRIBE then show its features (the "
                  "model's outputs unchanged); LABELS: their explanations, as Neuronpedia exports them"),
    StatementHelp("FEATURES", 'FEATURES "prompt" [AT LAYER n] [TOP k] [POSITIONS {LAST | ALL}]',
                  'FEATURES "The capital of France is" TOP 3;',
                  "the attached SAEs' strongest features at each position of the prompt, with the tokens each writes"),
    StatementHelp("SAE FEATURE", 'SAE ["dir" | "hook"] FEATURE n [TOP k]', "SAE FEATURE 123 TOP 5;",
                  "where one feature of an attached SAE fires most in larql's statistics corpus: each context "
                  "with its activation, and the feature's label and the tokens it writes"),
    StatementHelp("SHOW SAES", "SHOW SAES", "SHOW SAES;", "the SAEs and transcoders attached: hook point, kind, the hook point it writes, layer, architecture, width"),
    StatementHelp("DROP SAE", 'DROP SAE {"dir" | "hook"} | DROP SAES', 'DROP SAE "saes/blocks.6.hook_resid_post";',
                  "detach an SAE (by its USE SAE path or its hook point), or every one"),
    StatementHelp("EXTRACT", 'EXTRACT MODEL "src" INTO "dir.vindex" [WITH {INFERENCE | ALL}] [FORCE]',
                  'EXTRACT MODEL "gemma3-270m" INTO "g.vindex" WITH INFERENCE;',
                  "decompile a model into a vindex (the same code path and defaults as `larql extract`)"),
    StatementHelp("STATS", 'STATS ["dir.vindex"]', "STATS;", "what a vindex holds: model, layers, sizes"),
    StatementHelp("SHOW MODELS", "SHOW MODELS", "SHOW MODELS;", "the vindex directories in the current directory"),
    StatementHelp("DESCRIBE", 'DESCRIBE "entity" [ALL LAYERS | SYNTAX | KNOWLEDGE | OUTPUT] [AT LAYER n] '
                  "[RELATIONS ONLY] [VERBOSE | BRIEF | RAW]", 'DESCRIBE "France";',
                  "an entity's edges: probe edges through the model, feature edges by layer band"),
    StatementHelp("WALK", 'WALK "prompt" [TOP n] [LAYERS a-b | LAYERS ALL]',
                  'WALK "The capital of France is" TOP 5;',
                  "a per-layer feature scan of the prompt's last token (TOP features per layer)"),
    StatementHelp("EXPLAIN WALK", 'EXPLAIN WALK "prompt" [LAYERS a-b] [VERBOSE] [TOP n] [band] [RELATIONS ONLY]',
                  'EXPLAIN WALK "The capital of France is" LAYERS 10-12;', "WALK with each feature's relation label"),
    StatementHelp("SELECT", "SELECT {* | col, ...} FROM {EDGES | FEATURES | ENTITIES} "
                  '[NEAREST TO "entity" AT LAYER n] [WHERE cond [AND cond ...]] [ORDER BY col [ASC | DESC]] '
                  "[LIMIT n]", 'SELECT layer, feature, token FROM EDGES WHERE token = "Paris" LIMIT 5;',
                  "rows of the vindex; conditions: = != < > <= >= LIKE IN"),
    StatementHelp("INFER", 'INFER "prompt" [TOP n] [COMPARE] [STEER ["sae"] FEATURE n BY x]',
                  'INFER "The capital of France is" TOP 3;',
                  "the model's next-token distribution (COMPARE: walk FFN vs dense FFN; STEER: with x times an "
                  "attached SAE's feature added at its hook point)"),
    StatementHelp("EXPLAIN INFER", 'EXPLAIN INFER "prompt" [LAYERS a-b] [VERBOSE] [TOP n] [WITH ATTENTION]',
                  'EXPLAIN INFER "The capital of France is" TOP 3 WITH ATTENTION;',
                  "the features that fired per layer, the attended tokens, the logit lens"),
    StatementHelp("TRACE", 'TRACE "prompt" [FOR "token"] [DECOMPOSE] [LAYERS a-b] [POSITIONS {LAST | ALL}] '
                  '[SAVE "file.trace" [FORCE]]', 'TRACE "The capital of France is" FOR "Paris";',
                  "each layer's attention and MLP contribution to a token's logit"),
    StatementHelp("CROWN", 'CROWN "prompt" FOR "token" [SUBJECT "subject"]',
                  'CROWN "The capital of France is" FOR "Paris" SUBJECT "France";',
                  "which layer's MLP carries the fact (ablation per layer)"),
    StatementHelp("INSERT", 'INSERT INTO EDGES (entity, relation, target [, prompt] [, key]) VALUES ("...", ...) [, (...)] '
                  "[AT LAYER n | LAYERS a-b] [METHOD {ROME | MEMIT | FEATURE | NEURON}] [CONFIDENCE x]",
                  'INSERT INTO EDGES (entity, relation, target) VALUES ("France", "capital", "Rome");',
                  "teach the model a fact (measured on prompts the edit never saw); METHOD: the model's default "
                  "when none is named (NEURON on the bundled models); CONFIDENCE: the p(target) METHOD FEATURE "
                  "searches for, with one row and no prompt column (refused otherwise)"),
    StatementHelp("DELETE", "DELETE FROM EDGES WHERE cond [AND cond ...]",
                  "DELETE FROM EDGES WHERE layer = 3 AND feature = 17;", "silence features"),
    StatementHelp("UPDATE", "UPDATE EDGES SET col = value [, ...] WHERE cond [AND cond ...]",
                  'UPDATE EDGES SET token = "Rome" WHERE layer = 3 AND feature = 17;',
                  "rewrite what a feature is said to write (metadata only)"),
    StatementHelp("BEGIN PATCH", 'BEGIN PATCH "file.vlp" [FORCE]', 'BEGIN PATCH "edits.vlp";',
                  "record the following edits into a patch (FORCE: SAVE PATCH may replace the file)"),
    StatementHelp("SAVE PATCH", "SAVE PATCH [FORCE]", "SAVE PATCH;", "write the patch being recorded"),
    StatementHelp("APPLY PATCH", 'APPLY PATCH "file.vlp"', 'APPLY PATCH "edits.vlp";', "apply a saved patch"),
    StatementHelp("REMOVE PATCH", 'REMOVE PATCH "file.vlp"', 'REMOVE PATCH "edits.vlp";',
                  "take an applied patch off again (bit for bit)"),
    StatementHelp("SHOW PATCHES", "SHOW PATCHES", "SHOW PATCHES;", "the applied patches and their edits"),
    StatementHelp("COMPILE", 'COMPILE {CURRENT | "src.vindex"} INTO {VINDEX "dir" [ON CONFLICT {LAST_WINS | '
                  'HIGHEST_CONFIDENCE | FAIL}] | MODEL "out" [FORMAT {GGUF | SAFETENSORS}] [DTYPE {BF16 | F16 | F32}]} [FORCE]',
                  'COMPILE CURRENT INTO MODEL "edited.gguf" FORMAT GGUF;',
                  "bake the applied edits into files (FORCE replaces an existing output; never the vindex read)"),
    StatementHelp("SHOW LAYERS", "SHOW LAYERS [[RANGE] a-b]", "SHOW LAYERS 0-3;",
                  "each layer's band and most common output token"),
    StatementHelp("SHOW FEATURES", "SHOW FEATURES layer [WHERE cond [AND cond ...]] [LIMIT n]",
                  'SHOW FEATURES 12 WHERE token = "Paris" LIMIT 5;', "one layer's features"),
    StatementHelp("SHOW ENTITIES", "SHOW ENTITIES [[AT LAYER] n] [LIMIT n]", "SHOW ENTITIES AT LAYER 12 LIMIT 10;",
                  "the tokens most features write"),
    StatementHelp("SHOW RELATIONS", "SHOW RELATIONS [AT LAYER n] [WITH EXAMPLES] [VERBOSE | BRIEF]",
                  "SHOW RELATIONS WITH EXAMPLES;", "the relation clusters of the features"),
    StatementHelp("DIFF", 'DIFF {CURRENT | "a.vindex"} {CURRENT | "b.vindex"} [LAYER n] [RELATION "r"] [LIMIT n] '
                  '[INTO PATCH "file.vlp"]', 'DIFF "a.vindex" CURRENT LIMIT 20;',
                  "per-feature differences between two vindexes (INTO PATCH: a patch that turns a into b)"),
    StatementHelp("MERGE", 'MERGE {"src.vindex" | "file.vlp"} [ON CONFLICT {LAST_WINS | KEEP_CURRENT | '
                  'HIGHEST_CONFIDENCE | FAIL}]', 'MERGE "theirs.vlp" ON CONFLICT KEEP_CURRENT;',
                  "add a patch's or another vindex's edits to the edits in use, reporting each conflict"),
    StatementHelp("REBALANCE", "REBALANCE [AT LAYER n] [UNTIL CONVERGED] [MAX n] [FLOOR x] [CEILING x]",
                  "REBALANCE AT LAYER 12;", "re-tune the facts INSERT installed at a layer against each other"),
    StatementHelp("COMPACT", "COMPACT [MINOR | MAJOR]", "COMPACT;",
                  "fold the patch stack into fewer operations (every answer unchanged)"),
    StatementHelp("SHOW COMPACT STATUS", "SHOW COMPACT STATUS", "SHOW COMPACT STATUS;",
                  "what COMPACT MINOR / MAJOR would fold: patches, operations, bytes"),
)


# `a |> b |> c`: one statement whose stages run in order, each planned when its turn comes (after the
# ones before it ran), its results those of every stage; a stage's output is not passed to the next.
PIPE = ('WALK "The capital of France is" TOP 3 |> INFER "The capital of France is" TOP 3;',
        "one statement of several stages, run in order; its results are every stage's, in order (a stage's "
        "output is not an input of the next)")

# Spellings the grammar accepts that say what the default already does, or name another spelling
SPELLINGS: tuple[tuple[str, str], ...] = (
    ("EXTRACT ... WITH WEIGHTS", "WITH INFERENCE (LARQL's spelling)"),
    ("WALK ... LAYERS ALL", "the default: every layer"),
    ("DESCRIBE ... BRIEF, SHOW RELATIONS ... BRIEF", "the default mode"),
    ("SELECT ... ORDER BY col ASC", "the default order"),
    ("INSERT ... MODE COMPOSE (or MODE = COMPOSE)", "the only mode: the edit is in the FFN itself"),
    ("SHOW LAYERS RANGE a-b", "SHOW LAYERS a-b"),
    ("SHOW ENTITIES n", "SHOW ENTITIES AT LAYER n"),
    ("COMPACT", "COMPACT MAJOR"),
    ("ON CONFLICT LAST_WINS", "the default policy of MERGE and COMPILE ... INTO VINDEX"),
    ("MERGE ... ON CONFLICT KEEP_SOURCE / KEEP_TARGET", "LAST_WINS / KEEP_CURRENT (LARQL's spellings)"),
)


def lookup(name: str) -> list[StatementHelp]:
    """The entries `.help NAME` shows: an exact name, else every entry that starts with it
    (`.help show` lists the SHOW statements)."""
    key = " ".join(name.upper().replace(";", " ").split())
    exact = [s for s in STATEMENTS if s.name == key]
    return exact or [s for s in STATEMENTS if s.name.startswith(key)]


def overview() -> str:
    """Every statement with one example, the runnable ones first."""
    width = max(len(s.name) for s in STATEMENTS)
    lines = ["Statements (end each with ';'; `.help NAME` shows one statement's syntax):"]
    lines += [f"  {s.name:<{width}}  {s.example}" for s in STATEMENTS if s.implemented]
    missing = [s.name for s in STATEMENTS if not s.implemented]
    if missing:
        lines.append("  not implemented yet: " + ", ".join(missing))
    return "\n".join(lines)


def detail(name: str) -> str | None:
    """`.help NAME`: syntax, what it does and an example for each matching statement, or None."""
    found = lookup(name)
    if not found:
        return None
    return "\n\n".join(f"{s.name}: {s.summary}\n  syntax:  {s.syntax}\n  example: {s.example}" for s in found)
