"""Scoring an edit set before and after editing, with CounterFact's measures (and EasyEdit's).

For each edit record (see `edit_set.schema.json` and vindex_spec/EDITING.md):
- ES  efficacy: on the prompt, the new target is likelier than the true one (whole-target mean NLL,
      teacher-forced; without a true target: every token of the new target is the top-1);
- PS  paraphrase: the same on the user's paraphrases and on the prompt behind model-written prefixes
      from a seed the edit never saw (`facts.model_prefixes(seed=EVAL_PREFIX_SEED)`);
- NS  neighbourhood: on prompts about other subjects, their own target still beats the new one;
- RS  reverse: prompts about the old object ("Paris is the capital of") keep their answer;
- RelS relation specificity: prompts about the subject's other relations ("Most people in France
      speak" after an edit of France's capital) keep their answer as the first-token top-1;
- the same comparisons by first token only (LARQL's and larql's earlier benchmark), and token
  accuracy (every target token the top-1, EasyEdit's "reliability");
- magnitudes: mean probability of the whole new target on the prompt (product of its tokens);
- GEN: the greedy continuation of the prompt (8 tokens) names the new target;
- gen_ES / gen_PS, by generation (the "WILD" protocol, generation.py): the greedy continuation
  (10 tokens) of the prompt / of each paraphrase names the new target and not the old object;
- perplexity of a held-out text (perplexity.py), unedited and after the edits, when one is given;
- unrelated prompts (a broad fixed set, `UNRELATED`): how many keep their top-1, and mean KL;
- fluency (GE): ROME's n-gram entropy of greedy continuations of the generation prompts.
S is the harmonic mean of ES, PS and NS. Every score is measured on prompts the edit did not optimise
on, except ES (its own prompt), and reported beside the unedited model's.

Three protocols: "single" (each edit alone, then undone: ROME's table), "stacked" (all edits in one
apply, scored at the end: MEMIT's) and "sequential" (each edit its own apply, one after another in
one session, scored at the end). Editing is a callable, so any method is scored the same way.
"""

from __future__ import annotations

import json
import math
import time
import weakref
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from larql.edit.measure.generation import continuation_text, wild_hit
from larql.edit.measure.perplexity import perplexity
from larql.edit.measure.scoring import Scorer
from larql.edit.methods.facts import Fact, model_prefixes
from larql.errors import EditError
from larql.io.jsonfile import read_json
from larql.model.generate import log_softmax
from larql.model.interp import kl
from larql.model.model import Model

F32 = NDArray[np.float32]
EVAL_PREFIX_SEED = 1  # the edit optimises on facts.PREFIX_SEED's prefixes; these are others
EVAL_PREFIXES = 3
GEN_TOKENS = 8  # GEN reads the first this many tokens of the prompt's WILD continuation (WILD_TOKENS)
FLUENCY_TOKENS = 32
UNRELATED = ("The sun rises in the", "Two plus two equals", "The largest ocean on Earth is the",
             "A dog is a kind of", "The opposite of hot is", "Water freezes at zero degrees",
             "The colour of grass is", "Shakespeare was born in the town of", "Berlin is a city in",
             "The first man on the moon was", "The chemical symbol for gold is", "A week has seven",
             "The Great Wall is in", "Mount Everest is the highest mountain in", "The piano is a musical",
             "Bees make", "The Amazon river flows through", "Einstein is famous for the theory of",
             "The Mona Lisa was painted by", "In winter it is often", "A triangle has three",
             "The Pacific Ocean is the", "Coffee is made from", "The heart pumps")


@dataclass(frozen=True)
class EditRecord:
    subject: str
    prompt: str
    target_new: str
    relation: str = ""
    target_true: str | None = None
    paraphrases: tuple[str, ...] = ()
    neighbours: tuple[tuple[str, str], ...] = ()  # (prompt, its target)
    reverse: tuple[tuple[str, str], ...] = ()
    generation_prompts: tuple[str, ...] = ()
    other_relations: tuple[tuple[str, str], ...] = ()  # (prompt about the subject's other relation, answer)

    def fact(self) -> Fact:
        return Fact(self.subject, self.prompt, self.target_new, self.relation, self.target_true)


@lru_cache(maxsize=1)
def _edit_set_validator() -> Any:
    import jsonschema

    schema = json.loads(Path(__file__).with_name("edit_set.schema.json").read_text())
    return jsonschema.Draft202012Validator(schema)


MAX_EDIT_SET_BYTES = 256 << 20  # 100,000 edits (the schema's bound) of typical CounterFact size fit in ~150 MB
MAX_EDIT_SET_DEPTH = 8  # a set nests 4 deep (document, edits, edit, neighbours / reverse)


def load_edit_set(path: str | Path) -> list[EditRecord]:
    """Read and validate an edit-set JSON file (one line of error naming the first violation)."""
    path = Path(path)
    # bounded before it is read (size) and parsed (nesting), NaN refused: never a RecursionError or
    # a gigabyte allocation; the schema then bounds every list and string
    doc = read_json(path, MAX_EDIT_SET_BYTES, MAX_EDIT_SET_DEPTH, "edit-set", EditError)
    errors = sorted(_edit_set_validator().iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        at = "/".join(str(p) for p in errors[0].absolute_path) or "(top level)"
        raise EditError(f"{path}: edit set fails its schema at {at}: {errors[0].message}")
    out = []
    for i, e in enumerate(doc["edits"]):
        rec = EditRecord(e["subject"], e["prompt"], e["target_new"], e.get("relation", ""), e.get("target_true"),
                         tuple(e.get("paraphrases", ())),
                         tuple((n["prompt"], n["target"]) for n in e.get("neighbours", ())),
                         tuple((n["prompt"], n["target"]) for n in e.get("reverse", ())),
                         tuple(e.get("generation_prompts", ())),
                         tuple((n["prompt"], n["target"]) for n in e.get("other_relations", ())))
        try:
            rec.fact()
        except EditError as err:
            raise EditError(f"{path}: edit {i}: {err}") from None
        out.append(rec)
    return out


# -- scoring primitives -------------------------------------------------------------------------------


@dataclass
class Compare:
    """One prompt, a target it should prefer (`good`) against one it should not (`bad`)."""

    whole: float  # 1 if mean NLL(good) < mean NLL(bad)
    first: float  # 1 if p(first token of good) > p(first token of bad)


def _compare(sc: Scorer, prompt: str, good: str, bad: str) -> Compare:
    state = sc.prompt(prompt)
    g, b = sc.token_logps(state, good), sc.token_logps(state, bad)
    return Compare(float(np.mean([x for x, _ in g]) > np.mean([x for x, _ in b])), float(g[0][0] > b[0][0]))


def _accuracy(sc: Scorer, prompt: str, target: str) -> tuple[float, float]:
    """(every token top-1, probability of the whole target)."""
    toks = sc.token_logps(sc.prompt(prompt), target)
    return float(all(t for _, t in toks)), float(math.exp(sum(x for x, _ in toks)))


def ngram_entropy(ids: Sequence[int]) -> float:
    """ROME's generation entropy: 2/3 of the bigram entropy + 4/3 of the trigram entropy (bits)."""
    def ent(n: int) -> float:
        grams = Counter(tuple(ids[i: i + n]) for i in range(len(ids) - n + 1))
        total = sum(grams.values())
        return -sum(c / total * math.log2(c / total) for c in grams.values()) if total else 0.0
    return 2 / 3 * ent(2) + 4 / 3 * ent(3)


@dataclass
class EditScores:
    es: float | None = None
    ps: list[float] = field(default_factory=list)
    ns: list[float] = field(default_factory=list)
    rs: list[float] = field(default_factory=list)
    rels: list[float] = field(default_factory=list)  # other relations' first-token top-1 kept
    es_first: float | None = None
    ps_first: list[float] = field(default_factory=list)
    ns_first: list[float] = field(default_factory=list)
    acc: float = 0.0  # every token of the new target top-1 on the prompt
    para_acc: list[float] = field(default_factory=list)
    p_new: float = 0.0
    gen: float = 0.0
    gen_es: float = 0.0  # the prompt's greedy continuation names the new target, not the old
    gen_ps: list[float] = field(default_factory=list)  # the same for each paraphrase


def _paraphrases(rec: EditRecord, prefixes: Sequence[str]) -> list[str]:
    return list(rec.paraphrases) + [p + rec.prompt for p in prefixes]


def _neighbours(rec: EditRecord) -> list[tuple[str, str]]:
    return [(p, t) for p, t in rec.neighbours if t.strip() != rec.target_new.strip()]


def _pairs(rec: EditRecord, prefixes: Sequence[str]) -> list[tuple[str, str]]:
    """Every (prompt, target) `score_records` reads for `rec`."""
    targets = [rec.target_new] + ([rec.target_true] if rec.target_true is not None else [])
    out = [(p, t) for p in [rec.prompt, *_paraphrases(rec, prefixes)] for t in targets]
    return (out + [(p, t) for p, good in [*_neighbours(rec), *rec.reverse] for t in (good, rec.target_new)]
            + list(rec.other_relations))


def score_records(model: Model, records: Sequence[EditRecord], prefixes: Sequence[str]) -> list[EditScores]:
    """Each record's scores, every prompt scored in batches (Scorer.prefetch), which also continues
    each prompt greedily from its pass (the WILD continuations); the prompt's own continuation
    serves both GEN (its first GEN_TOKENS tokens) and gen_ES."""
    sc = Scorer(model)
    wild_prompts = [p for rec in records for p in [rec.prompt, *_paraphrases(rec, prefixes)]]
    sc.prefetch((pair for rec in records for pair in _pairs(rec, prefixes)), greedy=wild_prompts)
    wild = iter([sc.continuation(p) for p in wild_prompts])
    out = []
    for rec in records:
        s = EditScores()
        gen = next(wild)
        s.gen_es = wild_hit(continuation_text(model, gen), rec.target_new, rec.target_true)
        s.gen_ps = [wild_hit(continuation_text(model, next(wild)), rec.target_new, rec.target_true)
                    for _ in _paraphrases(rec, prefixes)]
        s.acc, s.p_new = _accuracy(sc, rec.prompt, rec.target_new)
        paras = _paraphrases(rec, prefixes)
        for p in paras:
            s.para_acc.append(_accuracy(sc, p, rec.target_new)[0])
        if rec.target_true is not None:
            c = _compare(sc, rec.prompt, rec.target_new, rec.target_true)
            s.es, s.es_first = c.whole, c.first
            for p in paras:
                c = _compare(sc, p, rec.target_new, rec.target_true)
                s.ps.append(c.whole)
                s.ps_first.append(c.first)
        else:  # a fictional subject has no true target: success is the new target's tokens being top-1
            s.es = s.es_first = s.acc
            s.ps = s.ps_first = list(s.para_acc)
        for prompt, target in _neighbours(rec):
            c = _compare(sc, prompt, target, rec.target_new)
            s.ns.append(c.whole)
            s.ns_first.append(c.first)
        for prompt, target in rec.reverse:
            s.rs.append(_compare(sc, prompt, target, rec.target_new).whole)
        for prompt, target in rec.other_relations:
            s.rels.append(float(sc.token_logps(sc.prompt(prompt), target)[0][1]))
        s.gen = float(rec.target_new.strip().lower() in model.detokenize(gen[:GEN_TOKENS]).lower())
        out.append(s)
    return out


def score_record(model: Model, rec: EditRecord, prefixes: Sequence[str]) -> EditScores:
    return score_records(model, [rec], prefixes)[0]


# model -> (its revision, the unrelated prompts' logits then): an INSERT measures them before and after,
# and the next INSERT's "before" is this one's "after" (0.7 s of a 3.4 s INSERT on gemma3-270m)
_unrelated: weakref.WeakKeyDictionary[Model, tuple[Hashable, NDArray[np.float32]]] = weakref.WeakKeyDictionary()


def unrelated_logps(model: Model) -> list[NDArray[np.float64]]:
    """Log-probabilities after each UNRELATED prompt, all in one batch; reused while the model
    computes what it computed then (`Model.revision()`: an edit, or a model that cannot say, runs
    them again)."""
    revision = model.revision()
    kept = _unrelated.get(model)
    if kept is not None and revision is not None and kept[0] == revision:
        logits = kept[1]
    else:
        logits = model.next_logits_batch([model.tokenize(p) for p in UNRELATED])  # (prompts, vocab)
        if revision is not None:
            logits.flags.writeable = False  # shared by later calls
            _unrelated[model] = (revision, logits)
    return [log_softmax(row, np.float64) for row in logits]


def fluency(model: Model, prompts: Sequence[str]) -> float:
    if not prompts:
        return float("nan")
    gens = model.generate_batch([model.tokenize(p) for p in prompts], FLUENCY_TOKENS)
    return float(np.mean([ngram_entropy(ids) for ids in gens]))


# -- protocols ------------------------------------------------------------------------------------------


Apply = Callable[[Sequence[EditRecord]], Callable[[], None]]  # makes the edits, returns their undo
PROTOCOLS = ("single", "stacked", "sequential")


def _mean(xs: Sequence[float | None]) -> float:
    vals = [x for x in xs if x is not None]
    return 100.0 * float(np.mean(vals)) if vals else float("nan")


def summarise(scores: Sequence[EditScores], unrelated_before: list[NDArray[np.float64]] | None = None,
              unrelated_after: list[NDArray[np.float64]] | None = None) -> dict[str, float]:
    def per_edit(key: str) -> list[float | None]:
        return [float(np.mean(getattr(s, key))) if getattr(s, key) else None for s in scores]
    es, ps, ns = _mean([s.es for s in scores]), _mean(per_edit("ps")), _mean(per_edit("ns"))
    out = {"S": 3 / (1 / es + 1 / ps + 1 / ns) if min(es, ps, ns) > 0 else 0.0, "ES": es, "PS": ps, "NS": ns,
           "RS": _mean(per_edit("rs")), "RelS": _mean([x for s in scores for x in s.rels]),
           "ES_first": _mean([s.es_first for s in scores]),
           "PS_first": _mean(per_edit("ps_first")), "NS_first": _mean(per_edit("ns_first")),
           "token_acc": _mean([s.acc for s in scores]), "para_token_acc": _mean(per_edit("para_acc")),
           "p_new": float(np.mean([s.p_new for s in scores])), "GEN": _mean([s.gen for s in scores]),
           "gen_ES": _mean([s.gen_es for s in scores]), "gen_PS": _mean(per_edit("gen_ps"))}
    if unrelated_before is not None and unrelated_after is not None:
        kls = [kl(b, a) for b, a in zip(unrelated_before, unrelated_after)]
        out["unrelated_top1_kept"] = _mean([float(np.argmax(b) == np.argmax(a))
                                            for b, a in zip(unrelated_before, unrelated_after)])
        out["unrelated_kl"] = float(np.mean(kls))
    return out


@dataclass
class EvalReport:
    edits: int
    unedited: dict[str, float]
    single: dict[str, float] | None
    stacked: dict[str, float] | None
    sequential: dict[str, float] | None = None
    seconds_sequential: float | None = None
    seconds_per_edit: float | None = None
    seconds_stacked: float | None = None
    per_edit: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"edits": self.edits, "unedited": self.unedited, "single": self.single, "stacked": self.stacked,
                "sequential": self.sequential, "seconds_per_edit": self.seconds_per_edit,
                "seconds_stacked": self.seconds_stacked, "seconds_sequential": self.seconds_sequential,
                "per_edit": self.per_edit}


def held_out_perplexity(model: Model, text: str | None, base: float | None = None) -> dict[str, float]:
    """{"perplexity": exp(mean NLL) of `text`} (nothing without a text), and with the unedited
    model's `base`, "perplexity_change": the edited model's change from it in percent."""
    if text is None:
        return {}
    ppl = perplexity(model, text).ppl
    return {"perplexity": ppl} | ({} if base is None else {"perplexity_change": 100.0 * (ppl / base - 1.0)})


def evaluate(model: Model, records: Sequence[EditRecord], apply: Apply, protocols: Sequence[str] = ("single", "stacked"),
             progress: Callable[[str], None] | None = None, held_out: str | None = None) -> EvalReport:
    """Score `records` unedited, then under each protocol. `apply(records)` edits `model` (in place,
    e.g. through its overlay) and returns a function that undoes exactly those edits. With a
    `held_out` text, its perplexity is measured unedited and after the stacked and sequential edits."""
    if not records:
        raise EditError("the edit set is empty")
    for p in protocols:
        if p not in PROTOCOLS:
            raise EditError(f"unknown protocol {p!r} ({', '.join(PROTOCOLS)})")
    say = progress or (lambda _msg: None)
    prefixes = model_prefixes(model, EVAL_PREFIXES, seed=EVAL_PREFIX_SEED)
    gen_prompts = [g for r in records for g in r.generation_prompts][:20]
    say("scoring the unedited model")
    base_scores = score_records(model, records, prefixes)
    base_unrelated = unrelated_logps(model)
    unedited = summarise(base_scores) | {"fluency": fluency(model, gen_prompts)} | held_out_perplexity(model, held_out)
    base_ppl = unedited.get("perplexity")
    report = EvalReport(len(records), unedited, None, None)
    if "single" in protocols:
        scores, kls, kept, times = [], [], [], []
        for i, r in enumerate(records):
            say(f"single edit {i + 1}/{len(records)}: {r.fact().label}")
            t0 = time.perf_counter()
            undo = apply([r])
            times.append(time.perf_counter() - t0)
            try:
                scores.append(score_record(model, r, prefixes))
                after = unrelated_logps(model)
            finally:
                undo()
            summary = summarise([scores[-1]], base_unrelated, after)
            kls.append(summary["unrelated_kl"])
            kept.append(summary["unrelated_top1_kept"])
            report.per_edit.append({"edit": r.fact().label, "seconds": times[-1], **summary})
            say(f"  {times[-1]:.1f} s; ES {summary['ES']:.0f} PS {summary['PS']:.0f} NS {summary['NS']:.0f} "
                f"RS {summary['RS']:.0f} RelS {summary['RelS']:.0f} GEN {summary['GEN']:.0f} unrelated kept {summary['unrelated_top1_kept']:.0f}")
        report.single = summarise(scores) | {"unrelated_kl": float(np.mean(kls)),
                                             "unrelated_top1_kept": float(np.mean(kept))}
        report.seconds_per_edit = float(np.mean(times))
    if "stacked" in protocols:
        say(f"all {len(records)} edits at once")
        t0 = time.perf_counter()
        undo = apply(list(records))
        report.seconds_stacked = time.perf_counter() - t0
        try:
            scores = score_records(model, records, prefixes)
            report.stacked = summarise(scores, base_unrelated, unrelated_logps(model)) | {
                "fluency": fluency(model, gen_prompts)} | held_out_perplexity(model, held_out, base_ppl)
        finally:
            undo()
    if "sequential" in protocols:
        say(f"{len(records)} edits one after another")
        t0 = time.perf_counter()
        undos = []
        try:
            for i, r in enumerate(records):
                say(f"sequential edit {i + 1}/{len(records)}: {r.fact().label}")
                undos.append(apply([r]))
            report.seconds_sequential = time.perf_counter() - t0
            scores = score_records(model, records, prefixes)
            report.sequential = summarise(scores, base_unrelated, unrelated_logps(model)) | {
                "fluency": fluency(model, gen_prompts)} | held_out_perplexity(model, held_out, base_ppl)
        finally:
            for undo in reversed(undos):
                undo()
    return report
