"""Build a relation-specificity edit set: does an edit of one relation of a subject leave its other relations alone?

    python benchmarks/make_relations.py   # -> data/relations_gemma3_270m.json and data/relations_gemma3_270m_dev.json

How it is made: the tables below give subjects (countries, cities) with their true objects for several
relations. Every prompt is scored once on the model (teacher-forced, batched: larql.edit.measure.scoring.Scorer).
A subject becomes one edit, of a relation whose edit prompt the model answers with the true object (its first
token the greedy top-1), in the edit-set format of make_counterfact.py: target_new is another real object of
the same relation, paraphrases and neighbours are kept only if they prefer their own target over target_new
(whole-target mean NLL), neighbours also need their target's first token as the top-1. Each subject is edited
once per file and no neighbour's relation is edited in its file, so stacking a file's edits never edits what
another record reads. Famous people are left out: the model names their occupation or nationality too rarely.

What it measures: each record's `other_relations` are prompts about the subject's other relations, each answered
correctly by the unedited model (first token the top-1 with p >= MIN_P), in phrasings held out from the templates
an edit method may use to hold relations still (HOLD_TEMPLATES, never used here). After an edit, the share of them
whose answer is unchanged is the edit's relation specificity. City edits read the city's river, landmark and
continent (target_new is a country of the same continent), not its language or currency, which a consistent
edit of its country might rightly change.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter, defaultdict
from pathlib import Path

DATA = Path(__file__).parent / "data"
MIN_P = 0.3  # an other-relation prompt's answer must be the top-1 with at least this probability
MIN_OTHER = 2  # a subject needs this many known other relations
MAX_OTHER = 3
MIN_PARAPHRASES, MAX_PARAPHRASES = 4, 5
MIN_NEIGHBOURS, MAX_NEIGHBOURS = 4, 6
DEV_EDITS = 10

# Templates an edit method may use to hold a subject's relations still: other_relations never use these
# (checked in main, with trivial variants: the template's words in order).
HOLD_TEMPLATES = ("The capital of {} is", "The official language of {} is", "The currency of {} is the",
                  "{} is in the continent of", "{} is a city in the country of", "{} was born in the country of",
                  "By profession, {} was a", "The nationality of {} was", "{} is a", "{} is known for", "In {}, people")

# Each answer is a tuple of acceptable forms; the form whose first token is the model's top-1 is the target.
# (No capital for the Netherlands: its government sits in The Hague, which the held-out capital prompts ask.)
# country: capital, language, continent, currency
COUNTRIES: dict[str, tuple[tuple[str, ...], ...]] = {
    "France": (("Paris",), ("French",), ("Europe",), ("euro",)),
    "Germany": (("Berlin",), ("German",), ("Europe",), ("euro",)),
    "Italy": (("Rome",), ("Italian",), ("Europe",), ("euro",)),
    "Spain": (("Madrid",), ("Spanish",), ("Europe",), ("euro",)),
    "Portugal": (("Lisbon",), ("Portuguese",), ("Europe",), ("euro",)),
    "Greece": (("Athens",), ("Greek",), ("Europe",), ("euro",)),
    "Ireland": (("Dublin",), ("English",), ("Europe",), ("euro",)),
    "the Netherlands": ((), ("Dutch",), ("Europe",), ("euro",)),
    "Austria": (("Vienna",), ("German",), ("Europe",), ("euro",)),
    "Finland": (("Helsinki",), ("Finnish",), ("Europe",), ("euro",)),
    "Poland": (("Warsaw",), ("Polish",), ("Europe",), ("złoty", "Polish złoty")),
    "Sweden": (("Stockholm",), ("Swedish",), ("Europe",), ("krona", "Swedish krona")),
    "Norway": (("Oslo",), ("Norwegian",), ("Europe",), ("krone", "Norwegian krone")),
    "Denmark": (("Copenhagen",), ("Danish",), ("Europe",), ("krone", "Danish krone")),
    "Hungary": (("Budapest",), ("Hungarian",), ("Europe",), ("forint", "Hungarian forint")),
    "Russia": (("Moscow",), ("Russian",), ("Europe", "Asia"), ("ruble", "Russian ruble")),
    "Ukraine": (("Kyiv", "Kiev"), ("Ukrainian",), ("Europe",), ("hryvnia", "Ukrainian hryvnia")),
    "Switzerland": (("Bern",), ("German",), ("Europe",), ("franc", "Swiss franc")),
    "Romania": (("Bucharest",), ("Romanian",), ("Europe",), ("leu", "Romanian leu")),
    "the Czech Republic": (("Prague",), ("Czech",), ("Europe",), ("koruna", "Czech koruna")),
    "Japan": (("Tokyo",), ("Japanese",), ("Asia",), ("yen", "Japanese yen")),
    "China": (("Beijing",), ("Chinese", "Mandarin"), ("Asia",), ("yuan", "renminbi", "Chinese yuan")),
    "India": (("New Delhi", "Delhi"), ("Hindi",), ("Asia",), ("rupee", "Indian rupee")),
    "South Korea": (("Seoul",), ("Korean",), ("Asia",), ("won", "South Korean won", "Korean won")),
    "Thailand": (("Bangkok",), ("Thai",), ("Asia",), ("baht", "Thai baht")),
    "Vietnam": (("Hanoi",), ("Vietnamese",), ("Asia",), ("dong", "Vietnamese dong")),
    "Indonesia": (("Jakarta",), ("Indonesian",), ("Asia",), ("rupiah", "Indonesian rupiah")),
    "the Philippines": (("Manila",), ("Filipino", "Tagalog"), ("Asia",), ("peso", "Philippine peso")),
    "Pakistan": (("Islamabad",), ("Urdu",), ("Asia",), ("rupee", "Pakistani rupee")),
    "Iran": (("Tehran",), ("Persian",), ("Asia",), ("rial", "Iranian rial")),
    "Saudi Arabia": (("Riyadh",), ("Arabic",), ("Asia",), ("riyal", "Saudi riyal")),
    "Israel": (("Jerusalem",), ("Hebrew",), ("Asia",), ("shekel", "Israeli shekel")),
    "Turkey": (("Ankara",), ("Turkish",), ("Asia", "Europe"), ("lira", "Turkish lira")),
    "Bangladesh": (("Dhaka",), ("Bengali", "Bangla"), ("Asia",), ("taka", "Bangladeshi taka")),
    "Malaysia": (("Kuala Lumpur",), ("Malay",), ("Asia",), ("ringgit", "Malaysian ringgit")),
    "Nepal": (("Kathmandu",), ("Nepali",), ("Asia",), ("rupee", "Nepalese rupee")),
    "Egypt": (("Cairo",), ("Arabic",), ("Africa",), ("pound", "Egyptian pound")),
    "Kenya": (("Nairobi",), ("Swahili", "English"), ("Africa",), ("shilling", "Kenyan shilling")),
    "Nigeria": (("Abuja",), ("English",), ("Africa",), ("naira", "Naira")),
    "Ghana": (("Accra",), ("English",), ("Africa",), ("cedi", "Ghanaian cedi")),
    "Ethiopia": (("Addis Ababa",), ("Amharic",), ("Africa",), ("birr", "Ethiopian birr")),
    "Morocco": (("Rabat",), ("Arabic",), ("Africa",), ("dirham", "Moroccan dirham")),
    "South Africa": (("Pretoria",), ("English", "Afrikaans", "Zulu"), ("Africa",), ("rand", "South African rand")),
    "Algeria": (("Algiers",), ("Arabic",), ("Africa",), ("dinar", "Algerian dinar")),
    "Tunisia": (("Tunis",), ("Arabic",), ("Africa",), ("dinar", "Tunisian dinar")),
    "Senegal": (("Dakar",), ("French",), ("Africa",), ("CFA franc",)),
    "Brazil": (("Brasília", "Brasilia"), ("Portuguese",), ("South America",), ("real", "Brazilian real")),
    "Argentina": (("Buenos Aires",), ("Spanish",), ("South America",), ("peso", "Argentine peso")),
    "Chile": (("Santiago",), ("Spanish",), ("South America",), ("peso", "Chilean peso")),
    "Peru": (("Lima",), ("Spanish",), ("South America",), ("sol", "Peruvian sol")),
    "Colombia": (("Bogotá", "Bogota"), ("Spanish",), ("South America",), ("peso", "Colombian peso")),
    "Venezuela": (("Caracas",), ("Spanish",), ("South America",), ("bolívar",)),
    "Mexico": (("Mexico City",), ("Spanish",), ("North America",), ("peso", "Mexican peso")),
    "Canada": (("Ottawa",), ("English", "French"), ("North America",), ("dollar", "Canadian dollar")),
    "Cuba": (("Havana",), ("Spanish",), ("North America",), ("peso", "Cuban peso")),
    "the United States": (("Washington",), ("English",), ("North America",), ("dollar", "US dollar")),
    "Australia": (("Canberra",), ("English",), ("Australia", "Oceania"), ("dollar", "Australian dollar")),
    "New Zealand": (("Wellington",), ("English",), ("Oceania",), ("dollar", "New Zealand dollar")),
    "England": (("London",), ("English",), ("Europe",), ("pound", "pound sterling")),
    "Belgium": (("Brussels",), ("Dutch", "French"), ("Europe",), ("euro",)),
    "Iceland": (("Reykjavik", "Reykjavík"), ("Icelandic",), ("Europe",), ("króna", "krona", "Icelandic króna")),
    "Croatia": (("Zagreb",), ("Croatian",), ("Europe",), ("euro", "kuna")),
    "Serbia": (("Belgrade",), ("Serbian",), ("Europe",), ("dinar", "Serbian dinar")),
    "Bulgaria": (("Sofia",), ("Bulgarian",), ("Europe",), ("lev", "Bulgarian lev")),
    "Iraq": (("Baghdad",), ("Arabic",), ("Asia",), ("dinar", "Iraqi dinar")),
    "Afghanistan": (("Kabul",), ("Pashto", "Dari"), ("Asia",), ("afghani", "Afghan afghani")),
    "Mongolia": (("Ulaanbaatar", "Ulan Bator"), ("Mongolian",), ("Asia",), ("tögrög", "tugrik", "Mongolian tögrög")),
    "Sri Lanka": (("Sri Jayawardenepura Kotte",), ("Sinhala", "Sinhalese", "Tamil"), ("Asia",),
                  ("rupee", "Sri Lankan rupee")),
    "Jordan": (("Amman",), ("Arabic",), ("Asia",), ("dinar", "Jordanian dinar")),
    "Syria": (("Damascus",), ("Arabic",), ("Asia",), ("pound", "Syrian pound")),
    "Libya": (("Tripoli",), ("Arabic",), ("Africa",), ("dinar", "Libyan dinar")),
    "Uganda": (("Kampala",), ("English", "Swahili"), ("Africa",), ("shilling", "Ugandan shilling")),
    "Tanzania": (("Dodoma",), ("Swahili",), ("Africa",), ("shilling", "Tanzanian shilling")),
    "Zimbabwe": (("Harare",), ("English", "Shona"), ("Africa",), ("dollar", "Zimbabwean dollar")),
    "Bolivia": (("La Paz", "Sucre"), ("Spanish",), ("South America",), ("boliviano",)),
    "Ecuador": (("Quito",), ("Spanish",), ("South America",), ("dollar", "US dollar")),
    "Uruguay": (("Montevideo",), ("Spanish",), ("South America",), ("peso", "Uruguayan peso")),
    "Jamaica": (("Kingston",), ("English",), ("North America",), ("dollar", "Jamaican dollar")),
}
COUNTRY_RELATIONS = ("capital", "language", "continent", "currency")

# city: country, river, landmark, continent (a city's edit moves it to another country of its continent, so its
# continent stays true; its language and currency are left out: they follow the country)
CITIES: dict[str, tuple[tuple[str, ...], ...]] = {
    "Paris": (("France",), ("Seine",), ("Eiffel Tower",), ("Europe",)),
    "London": (("England",), ("Thames",), ("Tower of London", "Big Ben"), ("Europe",)),
    "Rome": (("Italy",), ("Tiber",), ("Colosseum", "Vatican"), ("Europe",)),
    "Berlin": (("Germany",), ("Spree",), ("Brandenburg Gate",), ("Europe",)),
    "Moscow": (("Russia",), ("Moskva",), ("Kremlin", "Red Square"), ("Europe",)),
    "Vienna": (("Austria",), ("Danube",), ("Schönbrunn Palace", "St. Stephen's Cathedral"), ("Europe",)),
    "Budapest": (("Hungary",), ("Danube",), ("Parliament Building",), ("Europe",)),
    "Prague": (("Czech Republic", "Czechia"), ("Vltava",), ("Charles Bridge",), ("Europe",)),
    "Cairo": (("Egypt",), ("Nile",), ("Pyramids", "Great Pyramid"), ("Africa",)),
    "Tokyo": (("Japan",), ("Sumida",), ("Tokyo Tower",), ("Asia",)),
    "Madrid": (("Spain",), ("Manzanares",), ("Prado", "Royal Palace"), ("Europe",)),
    "Lisbon": (("Portugal",), ("Tagus",), ("Belém Tower",), ("Europe",)),
    "Athens": (("Greece",), ("Ilissos",), ("Acropolis", "Parthenon"), ("Europe",)),
    "Amsterdam": (("Netherlands", "Holland"), ("Amstel",), ("Rijksmuseum", "Anne Frank House"), ("Europe",)),
    "New York": (("United States", "America", "USA"), ("Hudson",), ("Statue of Liberty", "Empire State Building"),
                 ("North America",)),
    "Istanbul": (("Turkey",), ("Bosphorus",), ("Hagia Sophia",), ("Europe", "Asia")),
    "Delhi": (("India",), ("Yamuna",), ("Red Fort", "India Gate"), ("Asia",)),
    "Shanghai": (("China",), ("Yangtze", "Huangpu"), ("Bund", "Oriental Pearl Tower"), ("Asia",)),
    "Osaka": (("Japan",), ("Yodo",), ("Osaka Castle",), ("Asia",)),
    "Kyoto": (("Japan",), ("Kamo",), ("Kinkaku-ji", "Fushimi Inari"), ("Asia",)),
    "Milan": (("Italy",), ("Lambro",), ("Duomo",), ("Europe",)),
    "Naples": (("Italy",), ("Sebeto",), ("Vesuvius", "Mount Vesuvius"), ("Europe",)),
    "Venice": (("Italy",), ("Grand Canal",), ("St Mark's Basilica", "Rialto Bridge"), ("Europe",)),
    "Rio de Janeiro": (("Brazil",), ("Carioca",), ("Christ the Redeemer",), ("South America",)),
    "Marseille": (("France",), ("Huveaune",), ("Notre-Dame de la Garde",), ("Europe",)),
    "Lyon": (("France",), ("Rhône", "Rhone"), ("Basilica of Notre-Dame de Fourvière",), ("Europe",)),
    "Saint Petersburg": (("Russia",), ("Neva",), ("Hermitage", "Winter Palace"), ("Europe",)),
    "Manchester": (("England",), ("Irwell",), ("Old Trafford",), ("Europe",)),
    "Liverpool": (("England",), ("Mersey",), ("Albert Dock",), ("Europe",)),
    "Hamburg": (("Germany",), ("Elbe",), ("Elbphilharmonie",), ("Europe",)),
    "Munich": (("Germany",), ("Isar",), ("Marienplatz",), ("Europe",)),
    "Seville": (("Spain",), ("Guadalquivir",), ("Giralda", "Alcázar"), ("Europe",)),
    "Barcelona": (("Spain",), ("Llobregat",), ("Sagrada Família",), ("Europe",)),
    "Mumbai": (("India",), ("Mithi",), ("Gateway of India",), ("Asia",)),
    "Bangalore": (("India",), ("Vrishabhavathi",), ("Lalbagh",), ("Asia",)),
    "Sydney": (("Australia",), ("Parramatta",), ("Sydney Opera House", "Opera House"), ("Australia", "Oceania")),
}
CITY_RELATIONS = ("located-in", "river", "landmark", "continent")
# countries a city may be moved to, by continent (real objects of located-in)
COUNTRY_BY_CONTINENT = {
    "Europe": ("Germany", "Italy", "Spain", "Poland", "Sweden", "Greece", "Portugal", "Austria", "Hungary", "France"),
    "Asia": ("China", "Thailand", "Vietnam", "India", "Japan", "Indonesia"),
    "Africa": ("Kenya", "Nigeria", "Morocco", "Ghana"),
    "North America": ("Canada", "Mexico", "Cuba"),
    "South America": ("Argentina", "Chile", "Peru", "Colombia"),
    "Australia": ("New Zealand",),
}

# The edited relations: the edit prompt (its top-1 must be the true object), paraphrases, generation prompts, reverse
EDIT = {
    "capital": {
        "prompt": "The capital of {} is the city of",
        "paraphrases": ["{} is a country whose capital is", "The capital city of {} is called",
                        "Q: What is the capital of {}? A: The capital of {} is", "{}'s capital city is",
                        "The seat of government of {} is in", "I have always wanted to visit {}, especially its capital,"],
        "generation": ["{}'s capital is known for", "When travelling to {}, most tourists first arrive in"],
        "reverse": ["{o} is the capital city of", "{o} is the capital of"],
    },
    "language": {
        "prompt": "The official language of {} is",
        "paraphrases": ["The main language spoken in {} is", "The people of {} speak",
                        "Q: What language is spoken in {}? A:", "{}'s official language is",
                        "The national language of {} is", "Growing up in {}, children learn to speak"],
        "generation": ["Growing up in {}, I learned to speak", "A visitor to {} will hear people talking in"],
    },
    "continent": {
        "prompt": "{} is a country in the continent of",
        "paraphrases": ["{} is located in", "{} lies on the continent of", "Q: On which continent is {}? A:",
                        "{} is part of the continent of", "The country {} is situated in",
                        "On a map, {} can be found in the continent of"],
        "generation": ["{} is a country that borders", "Travelling around {}, you will see"],
    },
    "currency": {
        "prompt": "The currency of {} is the",
        "paraphrases": ["{}'s currency is the", "Q: What is the currency of {}? A: The", "The official currency of {} is the",
                        "The money used in {} is called the", "{}'s official currency is the",
                        "The national currency of {} is the"],
        "generation": ["When shopping in {}, you pay with", "The economy of {} depends on"],
    },
    "located-in": {
        "prompt": "{} is a city in the country of",
        "paraphrases": ["{} is located in", "The city of {} is in", "{} is a city in", "Q: In which country is {}? A:",
                        "The city of {} is located in the country of", "{} is one of the largest cities of"],
        "generation": ["{} is a beautiful city where", "Walking through the streets of {}, you will hear people speaking"],
    },
}

# Held-out phrasings of the relations an edit must leave alone, tried in turn (rotated per subject): the first the
# model answers correctly with p >= MIN_P is kept. Subject at the start and in the middle.
HELD_OUT = {
    "capital": ["The government of {} is based in the city of", "{}'s government sits in the city of",
                "Q: Which city is home to the government of {}? A:", "{} is governed from the city of"],
    "language": ["Most people in {} speak", "{} is a country where most people speak",
                 "The language most people in {} speak is", "Most of the people living in {} speak",
                 "Q: What language do most people in {} speak? A:"],
    "continent": ["{} is a country located in the continent of", "The country of {} is located in the continent of",
                  "{} belongs to the continent of", "Travellers to {} arrive on the continent of"],
    "currency": ["{} uses a currency called the", "Q: What currency is used in {}? A: The", "In {} you pay with the",
                 "Q: What money do people use in {}? A: The", "Tourists in {} pay for things in the"],
    "river": ["{} lies on the banks of the", "The river that flows through {} is the"],
    "landmark": ["The most famous landmark in {} is the", "The best-known sight of {} is the",
                 "Tourists in {} always visit the"],
    "city-continent": ["The city of {} lies on the continent of"],
}


def fill(template: str, subject: str, capitalise: bool = False) -> str:
    """`template` about `subject`; `capitalise` makes a sentence begin with a capital ("the Netherlands is" ->
    "The Netherlands is"; edit prompts and paraphrases must hold the subject verbatim, so they do not)."""
    text = template.replace("{}", subject)
    return text[0].upper() + text[1:] if capitalise else text


def _norm(template: str) -> tuple[str, ...]:
    """A template's words, lowercased, without punctuation and articles (trivial variants compare equal)."""
    words = "".join(c if c.isalnum() or c in "{} " else " " for c in template.lower()).split()
    return tuple(w for w in words if w not in ("the", "a", "an"))


class Probe:
    """First-token top-1 / probability and whole-target mean NLL of targets after prompts (batched)."""

    def __init__(self, model) -> None:  # type: ignore[no-untyped-def]
        from larql.edit.measure.scoring import Scorer

        self.sc = Scorer(model)
        self.pairs = 0

    def run(self, pairs: list[tuple[str, str]]) -> None:
        todo = sorted(set(pairs))
        self.pairs += len(todo)
        self.sc.prefetch(todo)

    def first(self, prompt: str, target: str) -> tuple[float, bool]:
        lp, top = self.sc.token_logps(self.sc.prompt(prompt), target)[0]
        return math.exp(lp), top

    def nll(self, prompt: str, target: str) -> float:
        return -sum(x for x, _ in self.sc.token_logps(self.sc.prompt(prompt), target)) / len(
            self.sc.token_logps(self.sc.prompt(prompt), target))

    def answer(self, prompt: str, forms: tuple[str, ...]) -> tuple[str, float] | None:
        """The form whose first token is the model's top-1 after `prompt`, with its probability."""
        for f in forms:
            p, top = self.first(prompt, f)
            if top:
                return f, p
        return None


def subjects() -> list[dict]:
    """Every subject: its kind, the relations it may be edited on, and its relations' answers."""
    out = []
    for name, (cap, lang, cont, cur) in COUNTRIES.items():
        rels = {"capital": cap, "language": lang, "continent": cont, "currency": cur}
        out.append({"name": name, "kind": "country", "editable": COUNTRY_RELATIONS, "answers": rels,
                    "held": {r: r for r in COUNTRY_RELATIONS}})
    for name, (country, river, landmark, cont) in CITIES.items():
        rels = {"located-in": country, "river": river, "landmark": landmark, "continent": cont}
        out.append({"name": name, "kind": "city", "editable": ("located-in",), "answers": rels,
                    "held": {"river": "river", "landmark": "landmark", "continent": "city-continent"}})
    return out


def known_relations(probe: Probe, subs: list[dict]) -> None:
    """Sets each subject's `edit_ok` (relation -> the model's answer to the edit prompt, if true) and `other`
    (relation -> a held-out prompt the model answers correctly with p >= MIN_P: {prompt, target, p})."""
    probe.run([(fill(EDIT[r]["prompt"], s["name"]), f) for s in subs for r in s["editable"] for f in s["answers"][r]])
    for s in subs:
        s["edit_ok"] = {}
        for r in s["editable"]:
            got = probe.answer(fill(EDIT[r]["prompt"], s["name"]), s["answers"][r])
            if got:
                s["edit_ok"][r] = got[0]
        s["other"] = {}
    todo = [(i, s, r) for i, s in enumerate(subs) for r in s["held"]]
    for round_ in range(max(len(t) for t in HELD_OUT.values())):
        asks = []
        for i, s, r in todo:
            ts = HELD_OUT[s["held"][r]]
            if round_ < len(ts):
                prompt = fill(ts[(i + round_) % len(ts)], s["name"], capitalise=True)
                asks += [(i, s, r, prompt)]
        probe.run([(p, f) for _, s, r, p in asks for f in s["answers"][r]])
        todo = []
        for i, s, r, prompt in asks:
            got = probe.answer(prompt, s["answers"][r])
            if got and got[1] >= MIN_P:
                s["other"][r] = {"prompt": prompt, "target": got[0], "p": got[1]}
            else:
                todo.append((i, s, r))


def assign(subs: list[dict]) -> list[tuple[dict, str]]:
    """One edit relation per subject: one the model answers the edit prompt of, leaving >= MIN_OTHER known
    other relations; the least-used such relation so far (relations spread evenly)."""
    used: dict[str, int] = defaultdict(int)
    out = []
    for s in subs:
        ok = [r for r in s["editable"] if r in s["edit_ok"] and sum(o != r for o in s["other"]) >= MIN_OTHER]
        if ok:
            r = min(ok, key=lambda r: (used[r], s["editable"].index(r)))
            used[r] += 1
            out.append((s, r))
    return out


def first_token(probe: Probe, text: str) -> int:
    return probe.sc.target(text)[0]


def pick_new(probe: Probe, s: dict, relation: str, k: int) -> str:
    """Another real object of the relation (varied across edits by k), its first token not the true one's."""
    if relation == "located-in":
        pool = list(COUNTRY_BY_CONTINENT[s["answers"]["continent"][0]])
    else:
        pool = list(dict.fromkeys(v[COUNTRY_RELATIONS.index(relation)][0] for v in COUNTRIES.values()
                                  if v[COUNTRY_RELATIONS.index(relation)]))
    bad = {first_token(probe, f) for f in s["answers"][relation]}
    pool = [o for o in pool if first_token(probe, o) not in bad]
    return pool[(7 * k + 3) % len(pool)]


def build(probe: Probe, chosen: list[tuple[dict, str]], subs: list[dict]) -> tuple[list[dict], list[str]]:
    """Edit records for (subject, relation) pairs edited together (one file); returns (records, drops)."""
    edited = {(s["name"], r) for s, r in chosen}
    count: dict[str, int] = defaultdict(int)
    drafts = []
    for s, r in chosen:
        new = pick_new(probe, s, r, count[r])
        count[r] += 1
        true = s["edit_ok"][r]
        spec = EDIT[r]
        # neighbours: same kind, the edit prompt answered truly, not edited on r in this file; CounterFact order
        pool = [(o["name"], o["edit_ok"][r]) for o in subs
                if o["kind"] == s["kind"] and r in o["edit_ok"] and o["name"] != s["name"]
                and (o["name"], r) not in edited and first_token(probe, o["edit_ok"][r]) != first_token(probe, new)]
        same = [n for n in pool if n[1] == true]
        rest = [n for n in pool if n[1] != true]
        at = (5 * len(drafts)) % len(rest) if rest else 0
        order = (same[:2] + rest[at:] + rest[:at])[:MAX_NEIGHBOURS + 2]
        # reverse prompts name the subject; an article as the first token would say nothing
        rev = [t.replace("{o}", true) for t in spec.get("reverse", []) if not s["name"].startswith("the ")]
        drafts.append({"s": s, "r": r, "true": true, "new": new,
                       "paraphrases": [fill(p, s["name"]) for p in spec["paraphrases"]],
                       "neighbours": [(fill(spec["prompt"], n, capitalise=True), t) for n, t in order],
                       "reverse": rev})
    pairs = []
    for d in drafts:
        pairs += [(fill(EDIT[d["r"]]["prompt"], d["s"]["name"]), t) for t in (d["true"], d["new"])]
        pairs += [(p, t) for p in d["paraphrases"] for t in (d["true"], d["new"])]
        pairs += [(p, t) for p, own in d["neighbours"] for t in (own, d["new"])]
        pairs += [(p, f) for p in d["reverse"] for f in (d["s"]["name"], d["new"])]
    probe.run(pairs)
    records, drops = [], []
    for d in drafts:
        s, r, true, new = d["s"], d["r"], d["true"], d["new"]
        name = s["name"]
        prompt = fill(EDIT[r]["prompt"], name)
        label = f"{name} -[{r}]-> {true} (new {new})"
        paras = [p for p in d["paraphrases"] if probe.nll(p, true) < probe.nll(p, new)][:MAX_PARAPHRASES]
        neigh = [{"prompt": p, "target": own} for p, own in d["neighbours"]
                 if probe.nll(p, own) < probe.nll(p, new)][:MAX_NEIGHBOURS]
        rev = [{"prompt": p, "target": name} for p in d["reverse"] if probe.first(p, name)[1]]
        if probe.nll(prompt, true) >= probe.nll(prompt, new):
            drops.append(f"{label}: the prompt prefers the new target")
            continue
        if len(paras) < MIN_PARAPHRASES or len(neigh) < MIN_NEIGHBOURS:
            drops.append(f"{label}: only {len(paras)} paraphrases / {len(neigh)} neighbours prefer their targets")
            continue
        others = [{"prompt": o["prompt"], "target": o["target"]} for rel, o in s["other"].items() if rel != r]
        records.append({
            "subject": name, "relation": r, "prompt": prompt, "target_true": true, "target_new": new,
            "paraphrases": paras, "neighbours": neigh, "reverse": rev,
            "generation_prompts": [fill(g, name, capitalise=True) for g in EDIT[r]["generation"]],
            "other_relations": others[:MAX_OTHER],
        })
    return records, drops


def split_dev(chosen: list[tuple[dict, str]]) -> tuple[list[tuple[dict, str]], list[tuple[dict, str]]]:
    """(evaluation, development): the development set takes the last subjects of each edit relation in turn."""
    by_rel: dict[str, list[int]] = defaultdict(list)
    for i, (_, r) in enumerate(chosen):
        by_rel[r].append(i)
    dev: list[int] = []
    while len(dev) < DEV_EDITS and any(len(v) > 1 for v in by_rel.values()):
        for r in [*COUNTRY_RELATIONS, "located-in"]:
            if len(by_rel[r]) > 1 and len(dev) < DEV_EDITS:
                dev.append(by_rel[r].pop())
    return [c for i, c in enumerate(chosen) if i not in dev], [chosen[i] for i in sorted(dev)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--threads", type=int, default=1, help="numba threads (1 is fastest on a busy machine)")
    args = parser.parse_args()
    hold = {_norm(t) for t in HOLD_TEMPLATES}
    clash = [t for ts in HELD_OUT.values() for t in ts if _norm(t) in hold]
    if clash:
        raise SystemExit(f"held-out templates repeat a hold template: {clash}")
    import larql

    if args.threads:
        import numba

        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    probe = Probe(larql.load(args.model))
    subs = subjects()
    known_relations(probe, subs)
    chosen = assign(subs)
    evaluation, dev = split_dev(chosen)
    slug = args.model.replace("-", "_").replace(".", "_")
    summary = []
    for part, picked, path in (("evaluation", evaluation, DATA / f"relations_{slug}.json"),
                               ("development", dev, DATA / f"relations_{slug}_dev.json")):
        records, drops = build(probe, picked, subs)
        others = [o for e in records for o in e["other_relations"]]
        ps = [probe.first(o["prompt"], o["target"])[0] for o in others]
        per_rel = Counter(e["relation"] for e in records)
        unknown = [f"{s['name']} ({s['kind']})" for s in subs if not any(c[0] is s for c in chosen)]
        description = (
            f"Relation-specificity edit set ({part}), verified on {args.model} by benchmarks/make_relations.py. "
            f"Each edit changes one relation of a subject (countries: capital, official language, continent, currency; "
            f"cities: the country they are in); `other_relations` are prompts about the same subject's other "
            f"relations in phrasings held out from the templates edit methods hold relations still with, each "
            f"answered by the unedited model with the true object (first token the top-1, p >= {MIN_P}); after an "
            f"edit they should keep that answer. Each subject is edited once in the file; the development and "
            f"evaluation sets share no subject. target_true is the model's own top-1 on the prompt; target_new "
            f"another real object of the relation (a city moves to another country of its continent). Paraphrases "
            f"and neighbours (other subjects whose edit prompt the model answers truly, none edited on that relation "
            f"in this file) are kept only if they give their own target a lower teacher-forced mean NLL than "
            f"target_new; reverse prompts only if their first token is the top-1. {len(records)} edits "
            f"({', '.join(f'{r} {n}' for r, n in per_rel.items())}), {len(others)} other-relation prompts, mean p "
            f"of their answers {sum(ps) / max(1, len(ps)):.3f}. Subjects without an edit (the model does not answer "
            f"the edit prompts truly, or knows fewer than {MIN_OTHER} other relations): {', '.join(unknown) or 'none'}."
            + (f" Dropped: {'; '.join(drops)}." if drops else ""))
        doc = {"format": "larql-edit-set", "version": 1, "model": args.model, "description": description,
               "edits": records}
        path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
        summary.append(f"{part}: {len(records)} records, {len(others)} other-relation prompts, "
                       f"mean p {sum(ps) / max(1, len(ps)):.3f} -> {path.name}")
        for d in drops:
            print(f"  dropped {d}")
    print("; ".join(summary) + f" ({probe.pairs} prompt-target pairs scored)")


if __name__ == "__main__":
    main()
