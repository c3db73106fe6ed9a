"""Build an edit set of 1,000 edits about FICTIONAL subjects (seeded, deterministic).

    python benchmarks/make_fictional.py            # -> benchmarks/data/fictional_1000.json
    python benchmarks/make_fictional.py --n 200 --seed 3 --out /tmp/f.json

Subjects are invented names from a seeded syllable generator: countries ("Vrellandia"), companies
("Tavoro Labs") and people ("Oskarine Brule"). A name part is rejected when it is a real word: a single
token (as " Word" or " word") in the vocabulary of either bundled model's tokenizer (gemma3-270m: 262k
tokens, many languages; smollm2-135m: 49k, mostly English), or a real place / person named anywhere in
this file or in counterfact_source.json. Every subject is unique in the set.

Eight relations with natural templates, 125 edits each: a country's capital, official language and
continent; a company's founder and headquarters city; a person's birthplace, occupation and sport.
target_new is drawn (seeded) from a realistic object list for the relation. Each edit has 2 paraphrases
(from the relation's paraphrase templates, seeded choice), 2 neighbours = the prompts of two OTHER
fictional edits of the same relation with THEIR target_new (a different object from this edit's, so a
stacked set can be checked for cross-talk), and 2 generation prompts. There is no target_true: the
subjects have none, so efficacy is measured against the unedited model's own continuation.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

DATA = Path(__file__).parent / "data"

ONSETS = ["b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "pr", "r", "s", "sh",
          "st", "t", "th", "tr", "v", "vr", "z"]
VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o", "ae", "ei", "ou"]
CODAS = ["", "", "", "", "n", "r", "l", "s", "m", "nd", "rt", "sk", "v"]
COUNTRY_ENDS = ["ia", "land", "stan", "ora", "avia", "enia", "ova", "esh", "ador", "ania", "istan", "onia"]
FIRST_ENDS = ["a", "ine", "o", "el", "an", "ia", "ette", "us", "ard", "wen"]
COMPANY_KINDS = ["Labs", "Systems", "Industries", "Motors", "Foods", "Dynamics", "Networks", "Group", "Pharma",
                 "Studios", "Logistics", "Energy", "Robotics", "Textiles", "Software", "Airlines"]

CITIES = ["Paris", "Tokyo", "Warsaw", "Oslo", "Dublin", "Madrid", "Rome", "Berlin", "Vienna", "Lisbon", "Athens",
          "Cairo", "Nairobi", "Lima", "Ottawa", "Canberra", "Stockholm", "Helsinki", "Prague", "Budapest", "Seoul",
          "Bangkok", "Moscow", "Beijing", "London", "Copenhagen", "Amsterdam", "Brussels"]
BIG_CITIES = ["London", "New York", "Tokyo", "Paris", "Berlin", "Seattle", "Chicago", "Toronto", "Sydney", "Mumbai",
              "Shanghai", "Zurich", "Stockholm", "Amsterdam", "Singapore", "Dubai", "Munich", "Boston", "Osaka",
              "Milan", "Madrid", "Vienna", "Dublin", "Seoul"]
RELATIONS = {
    "capital": {
        "kind": "country", "prompt": "The capital of {} is",
        "paraphrases": ["{}'s capital city is", "Q: What is the capital of {}? A:", "The seat of government of {} is in",
                        "In {}, the parliament meets in the city of", "Most visitors to {} first arrive in its capital,"],
        "generation": ["{} is a country where", "The capital of {} is famous for"],
        "objects": CITIES,
    },
    "language": {
        "kind": "country", "prompt": "The official language of {} is",
        "paraphrases": ["In {}, most people speak", "The main language spoken in {} is",
                        "Q: What language do people speak in {}? A:", "{}'s official language is",
                        "Schools in {} teach children in"],
        "generation": ["Growing up in {}, I learned to speak", "A visitor to {} will hear people talking in"],
        "objects": ["French", "Spanish", "German", "Italian", "Portuguese", "Russian", "Japanese", "Arabic", "Swedish",
                    "Dutch", "Greek", "Polish", "Turkish", "Korean", "Hindi", "Finnish", "English", "Chinese"],
    },
    "continent": {
        "kind": "country", "prompt": "{} is a country in the continent of",
        "paraphrases": ["{} is located in", "{} lies on the continent of", "Q: On which continent is {}? A:",
                        "Geographically, {} is part of", "The nation of {} is found in"],
        "generation": ["{} is a country that borders", "Travelling around {}, you will see"],
        "objects": ["Africa", "Asia", "Europe", "South America", "North America", "Australia"],
    },
    "founder": {
        "kind": "company", "prompt": "{} was founded by",
        "paraphrases": ["The founder of {} is", "Q: Who founded {}? A:", "The company {} was started by",
                        "{} was created in a garage by its founder,", "The man who founded {} is"],
        "generation": ["{} is a company that", "The history of {} began when"],
        "objects": ["Steve Jobs", "Bill Gates", "Henry Ford", "Walt Disney", "Larry Page", "Jeff Bezos", "Elon Musk",
                    "Mark Zuckerberg", "Richard Branson", "Soichiro Honda", "Enzo Ferrari", "Ingvar Kamprad",
                    "Akio Morita", "Michael Dell", "Jack Ma", "Warren Buffett"],
    },
    "headquarters": {
        "kind": "company", "prompt": "The headquarters of {} are in",
        "paraphrases": ["{} is headquartered in", "Q: Where is {} based? A:", "{} has its head office in",
                        "The main offices of {} are located in", "{} is a company based in"],
        "generation": ["{} is a company that", "People who work at {} say that"],
        "objects": BIG_CITIES,
    },
    "birthplace": {
        "kind": "person", "prompt": "{} was born in",
        "paraphrases": ["{}'s birthplace is", "Q: Where was {} born? A:", "{} was born and raised in",
                        "The city where {} was born is", "{} spent a childhood in the city of"],
        "generation": ["{} grew up in a family that", "As a child, {} loved"],
        "objects": BIG_CITIES,
    },
    "occupation": {
        "kind": "person", "prompt": "{} is a famous",
        "paraphrases": ["By profession, {} is a", "Q: What is {}'s profession? A: A", "{} works as a",
                        "{} is well known as a", "{} earns a living as a"],
        "generation": ["{} spends most days", "{} is remembered for"],
        "objects": ["physicist", "composer", "painter", "lawyer", "nurse", "journalist", "chef", "pilot", "teacher",
                    "doctor", "poet", "novelist", "farmer", "sculptor", "photographer", "dancer", "singer", "surgeon",
                    "banker", "diplomat", "mathematician", "chemist", "historian", "philosopher"],
    },
    "sport": {
        "kind": "person", "prompt": "{} is a professional athlete who plays",
        "paraphrases": ["The sport {} plays professionally is", "Q: Which sport does {} play? A:",
                        "{} is a professional player of", "{} has won many trophies playing",
                        "Every weekend, {} trains hard at"],
        "generation": ["{} trains every day", "Fans of {} know that"],
        "objects": ["football", "tennis", "basketball", "cricket", "golf", "baseball", "rugby", "hockey", "volleyball",
                    "badminton", "handball", "table tennis"],
    },
}


class Namer:
    """Seeded invented names; a part is rejected if either bundled tokenizer has it as one token."""

    def __init__(self, rng: random.Random, tokenizers: list, banned: set[str]) -> None:  # type: ignore[type-arg]
        self.rng, self.toks, self.banned = rng, tokenizers, {b.lower() for b in banned}
        self.used: set[str] = set()
        self.rejected = 0

    def _real(self, word: str) -> bool:
        if word.lower() in self.banned or len(word) < 4:
            return True
        for tok in self.toks:
            for form in (word, word.lower()):
                if len(tok.encode(" " + form, add_special_tokens=False).ids) == 1:
                    return True
        return False

    def _stem(self, syllables: int) -> str:
        """Consonant-vowel syllables (no inner consonant clusters), ending in a vowel."""
        return "".join(self.rng.choice(ONSETS) + self.rng.choice(VOWELS) for _ in range(syllables))

    def _join(self, stem: str, ending: str) -> str:
        """stem + ending, dropping the stem's last vowel(s) before an ending that starts with one."""
        return (stem.rstrip("aeiou") if ending[:1] in "aeiou" else stem) + ending

    def _part(self, make) -> str:  # type: ignore[no-untyped-def]
        while True:
            w = make().capitalize()
            if w.lower() not in self.used and not self._real(w):
                self.used.add(w.lower())
                return w
            self.rejected += 1

    def country(self) -> str:
        r = self.rng
        return self._part(lambda: self._join(self._stem(r.choice([1, 2, 2])), r.choice(COUNTRY_ENDS)))

    def company(self) -> str:
        r = self.rng
        stem = self._part(lambda: self._stem(r.choice([2, 2, 3])) + r.choice(["n", "r", "x", "l", "", ""]))
        return f"{stem} {r.choice(COMPANY_KINDS)}"

    def person(self) -> str:
        r = self.rng
        first = self._part(lambda: self._join(self._stem(r.choice([1, 2])), r.choice(FIRST_ENDS)))
        last = self._part(lambda: self._stem(r.choice([2, 2, 3])) + r.choice(CODAS))
        return f"{first} {last}"


def real_names() -> set[str]:
    """Real places and people this repo's edit data names (a fictional subject must not be one)."""
    names = set(CITIES) | set(BIG_CITIES)
    for rel in RELATIONS.values():
        names |= {w for o in rel["objects"] for w in o.split()}
    src = json.loads((DATA / "counterfact_source.json").read_text())
    for key in src["facts"]:
        names |= set(key.split("/", 1)[1].split())
    for pool in src["neighbour_pool"].values():
        for s, t in pool.items():
            names |= set(s.split()) | set(t.split())
    return names


def build(n: int, seed: int, tokenizers: list) -> tuple[list[dict], int]:  # type: ignore[type-arg]
    rng = random.Random(seed)
    namer = Namer(rng, tokenizers, real_names())
    rels = list(RELATIONS)
    per = [n // len(rels) + (1 if i < n % len(rels) else 0) for i in range(len(rels))]
    edits: list[dict] = []
    for rel, count in zip(rels, per):
        spec = RELATIONS[rel]
        group = []
        for _ in range(count):
            s = getattr(namer, spec["kind"])()
            group.append({
                "subject": s, "relation": rel, "prompt": spec["prompt"].format(s),
                "target_new": rng.choice(spec["objects"]),
                "paraphrases": [p.format(s) for p in rng.sample(spec["paraphrases"], 2)],
                "generation_prompts": [g.format(s) for g in spec["generation"]],
            })
        for i, e in enumerate(group):
            others = [o for j, o in enumerate(group) if j != i and o["target_new"] != e["target_new"]]
            e["neighbours"] = [{"prompt": o["prompt"], "target": o["target_new"]} for o in rng.sample(others, 2)]
            e = {k: e[k] for k in ("subject", "relation", "prompt", "target_new", "paraphrases", "neighbours",
                                   "generation_prompts")}
            edits.append(e)
    return edits, namer.rejected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(DATA / "fictional_1000.json"))
    args = parser.parse_args()
    import larql

    tokenizers = [larql.load(name).tokenizer.tok for name in ("gemma3-270m", "smollm2-135m")]
    edits, rejected = build(args.n, args.seed, tokenizers)
    description = (
        f"{len(edits)} edits about fictional subjects (benchmarks/make_fictional.py --n {args.n} --seed {args.seed}): "
        f"invented country, company and person names from a seeded syllable generator ({rejected} candidate names "
        f"rejected as real words, i.e. a single token in the gemma3-270m or smollm2-135m vocabulary, or as real "
        f"places / people, or as repeats). {len(RELATIONS)} relations ({', '.join(RELATIONS)}), "
        f"{args.n // len(RELATIONS)} edits each; target_new drawn from a realistic object list per relation; "
        f"2 template paraphrases; 2 neighbours = the prompts of other fictional edits of the same relation with "
        f"their own target_new (which differs from this edit's), to test stacked edits for cross-talk. No "
        f"target_true (the subjects have none); not verified against a model."
    )
    doc = {"format": "larql-edit-set", "version": 1, "description": description, "edits": edits}
    Path(args.out).write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"{description}\n-> {args.out}")


if __name__ == "__main__":
    main()
