"""A seeded, fictional encyclopedia and its multi-hop questions: the offline dataset of CI and the demo.

Our machines cannot reach the model hub, and a model can answer many HotpotQA questions from
memory. This generator invents a world (countries, cities, people, films, organisations, with
dates and relations), renders one Wikipedia-style paragraph per entity, and asks questions of
the four 2WikiMultiHopQA types (comparison, inference, compositional, bridge_comparison) plus
HotpotQA-style bridge questions. Every name is made of invented syllables, so no model can
answer from memory, and every question is answerable from its gold paragraphs alone.

With `lexicon=N`, names are built from a shared list of N invented words (seeded once, the same
for every world of that size) instead of fresh syllables: a name is then two or three whole
words, which a small model's tokenizer keeps as whole tokens, and two worlds share words but not
names. The CPU learning run uses it (configs/data/learn_cpu.yaml): its tiny lead must copy names
it has never seen from the question and the findings, and copying a few known tokens is learnt
in minutes where copying six unseen syllables was not (docs/learning.md).

It emits rows in the FlashRAG 2Wiki schema (``id``, ``question``, ``golden_answers``,
``metadata.{type, context, supporting_facts, evidences}``), so `data_prep.sources.read_2wiki`
reads it like the real set, and packing, controlled sets, eval and training data run on it
unchanged. Output depends only on the arguments (seeded `random.Random`, no global state).

    >>> rows = build_synthetic_eval(num_questions=128, lengths=(50, 100, 200), seed=0)
    parser data --config-name synthetic_eval
"""
from __future__ import annotations

import dataclasses
import random
from typing import Any, Sequence

from data_prep.packing import build_grid
from data_prep.records import Corpus, Question
from data_prep.sources import read_2wiki

QUESTION_TYPES = ("comparison", "inference", "compositional", "bridge_comparison", "bridge")
# Not in the default cycle: single-fact questions (one lookup), for sets that mix one- and
# two-hop chains (the CPU learning run: configs/data/learn_cpu.yaml).
ONE_HOP = "one_hop"

_ONSETS = ["b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kl", "l", "m", "n", "p", "qu", "r", "s", "st",
           "t", "th", "v", "vr", "z", "zh", "y", "w", "c", "cr", "j", "x"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou", "ia", "y"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "m", "x", "nd", "rk", "v"]
_CITY_SUFFIXES = ["", "", "burg", "ford", " Vale", "port", "ica"]
# Every lexicon of one size is drawn with this seed, so the worlds of a run share their words.
LEXICON_SEED = 0
_OCCUPATIONS = ["film director", "film director", "painter", "composer", "novelist", "architect", "actor",
                "physicist", "sculptor", "diplomat"]
_FILM_ADJ = ["Silent", "Crimson", "Hollow", "Distant", "Amber", "Broken", "Velvet", "Frozen", "Gilded", "Quiet",
             "Burning", "Pale", "Wandering", "Hidden", "Iron", "Glass", "Lonely", "Northern", "Final", "Second"]
_FILM_NOUN = ["Harbour", "Orchard", "Lantern", "Meridian", "Canal", "Verdict", "Tide", "Cathedral", "Parade",
              "Archive", "Compass", "Garden", "Ferry", "Mirror", "Border", "Season", "Letter", "Carousel",
              "Lighthouse", "Witness"]
_GENRES = ["drama", "comedy", "thriller", "musical", "war film", "romance", "mystery film", "documentary"]
_ORG_KINDS = ["Pictures", "Studios", "Film Company", "Institute", "Works", "Society", "Foundation", "Press"]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"]


def _date(d: tuple[int, int, int]) -> str:
    return f"{d[2]} {_MONTHS[d[1] - 1]} {d[0]}"


@dataclasses.dataclass
class Entity:
    kind: str  # person / film / city / country / org
    name: str
    attrs: dict[str, Any]
    sentences: list[str] = dataclasses.field(default_factory=list)


def lexicon_words(size: int) -> list[str]:
    """`size` distinct capitalised words of one or two syllables and a coda, seeded by LEXICON_SEED."""
    rng, words = random.Random(LEXICON_SEED), {}
    if size > 2000:
        raise ValueError(f"lexicon={size}: at most 2000 words")
    while len(words) < size:
        syllables = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.randint(1, 2)))
        words[(syllables + rng.choice(_CODAS)).capitalize()] = None
    return list(words)


class World:
    """All entities of one seeded world; `paragraph(name)` is the entity's title + sentences.
    `lexicon`: build names from `lexicon_words(lexicon)` (whole words; a city is two of them)."""

    def __init__(self, num_paragraphs: int, seed: int, lexicon: int | None = None):
        self.rng = random.Random(seed)
        self.lexicon = lexicon_words(lexicon) if lexicon else None
        self.used: set[str] = set()
        self.entities: dict[str, Entity] = {}
        n_countries = 12
        n_cities = max(40, num_paragraphs // 12)
        n_orgs = max(30, num_paragraphs // 12)
        n_films = max(60, num_paragraphs * 2 // 5)
        n_people = max(60, num_paragraphs - n_countries - n_cities - n_orgs - n_films)
        self.countries = [self._add("country", self._word(2, 3).capitalize() + self.rng.choice(["ia", "land", "or", "ova", "istan", "ea"]), {}) for _ in range(n_countries)]
        for c in self.countries:
            c.attrs["demonym"] = c.name.rstrip("a") + "ian" if not c.name.endswith("land") else c.name[:-4] + "ish"
        self.cities = [self._add("city", self._city_name(),
                                 {"country": self.rng.choice(self.countries).name, "founded": self.rng.randint(900, 1800),
                                  "population": self.rng.randint(5, 900) * 1000}) for _ in range(n_cities)]
        self.people: list[Entity] = []
        for i in range(n_people):
            self.people.append(self._person(generation=i * 4 // n_people))  # 4 generations, oldest first
        by_gen: dict[tuple[int, str], list[Entity]] = {}
        for p in self.people:
            by_gen.setdefault((p.attrs["generation"], p.attrs["sex"]), []).append(p)
        for p in self.people:  # fathers come from the previous generation and share the family name
            older = by_gen.get((p.attrs["generation"] - 1, "m"))
            if older and self.rng.random() < 0.8:
                father = self.rng.choice(older)
                p.attrs["father"] = father.name
                new_name = f"{p.name.split()[0]} {father.name.split()[-1]}"
                if new_name not in self.used:
                    self._rename(p, new_name)
        for p in self.people:
            peers = by_gen.get((p.attrs["generation"], "f" if p.attrs["sex"] == "m" else "m"))
            if "spouse" not in p.attrs and peers and self.rng.random() < 0.5:
                s = self.rng.choice(peers)
                if "spouse" not in s.attrs:
                    p.attrs["spouse"], s.attrs["spouse"] = s.name, p.name
        self.orgs = [self._add("org", f"{self._word(2, 2).capitalize()} {self.rng.choice(_ORG_KINDS)}",
                               {"founded": self.rng.randint(1880, 1990), "hq": self.rng.choice(self.cities).name,
                                "founder": self.rng.choice(self.people).name}) for _ in range(n_orgs)]
        directors = [p for p in self.people if p.attrs["occupation"] == "film director"]
        self.films = []
        for _ in range(n_films):
            d = self.rng.choice(directors)
            last = d.attrs["died"][0] if d.attrs["died"] else 2020
            year = min(last, d.attrs["born"][0] + self.rng.randint(25, 60))
            self.films.append(self._add("film", self._film_title(), {
                "director": d.name, "year": year, "studio": self.rng.choice(self.orgs).name,
                "genre": self.rng.choice(_GENRES), "country": self.rng.choice(self.countries).name}))
        for e in self.entities.values():
            e.sentences = self._describe(e)

    # -- naming --------------------------------------------------------------------------------
    def _word(self, lo: int, hi: int) -> str:
        if self.lexicon:
            return self.rng.choice(self.lexicon)
        return "".join(self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(self.rng.randint(lo, hi))) + self.rng.choice(_CODAS)

    def _city_name(self) -> str:
        if self.lexicon:  # two words: a one-word city of one world would be another world's name
            return f"{self._word(2, 3)} {self._word(2, 3)}"
        return self._word(2, 3).capitalize() + self.rng.choice(_CITY_SUFFIXES)

    def _add(self, kind: str, name: str, attrs: dict[str, Any]) -> Entity:
        base, n = name, 1
        while name in self.used:
            n += 1
            name = f"{base} {n}" if kind != "film" else f"{base} ({n})"
        self.used.add(name)
        e = Entity(kind, name, attrs)
        self.entities[name] = e
        return e

    def _rename(self, e: Entity, name: str) -> None:
        self.used.discard(e.name)
        del self.entities[e.name]
        e.name = name
        self.used.add(name)
        self.entities[name] = e

    def _film_title(self) -> str:
        r = self.rng.random()
        if r < 0.4 and not self.lexicon:  # few such titles: in a run of several worlds they would recur
            return f"The {self.rng.choice(_FILM_ADJ)} {self.rng.choice(_FILM_NOUN)}"
        if r < 0.7:
            return f"{self.rng.choice(_FILM_NOUN)} of {self._word(2, 3).capitalize()}"
        return f"{self._word(2, 3).capitalize()} {self.rng.choice(_FILM_NOUN)}"

    def _person(self, generation: int) -> Entity:
        sex = self.rng.choice("mf")
        born_year = 1840 + generation * 30 + self.rng.randint(0, 25)
        born = (born_year, self.rng.randint(1, 12), self.rng.randint(1, 28))
        died = None
        if born_year < 1960 or self.rng.random() < 0.3:
            died = (min(2023, born_year + self.rng.randint(38, 95)), self.rng.randint(1, 12), self.rng.randint(1, 28))
        occupation = "film director" if generation >= 1 and self.rng.random() < 0.35 else self.rng.choice(_OCCUPATIONS)
        name = f"{self._word(1, 2).capitalize()} {self._word(2, 3).capitalize()}"
        return self._add("person", name, {"sex": sex, "born": born, "died": died, "generation": generation,
                                           "birthplace": self.rng.choice(self.cities).name, "occupation": occupation})

    # -- rendering ------------------------------------------------------------------------------
    def _describe(self, e: Entity) -> list[str]:
        a, rng = e.attrs, self.rng
        if e.kind == "person":
            he = "He" if a["sex"] == "m" else "She"
            country = self.entities[a["birthplace"]].attrs["country"]
            demonym = self.entities[country].attrs["demonym"]
            life = f"born {_date(a['born'])}" + (f"; died {_date(a['died'])}" if a["died"] else "")
            s = [f"{e.name} ({life}) was a {demonym} {a['occupation']}. ",
                 f"{he} was born in {a['birthplace']}, {country}. "]
            if "father" in a:
                s.append(f"{he} was the {'son' if a['sex'] == 'm' else 'daughter'} of {a['father']}. ")
            if "spouse" in a:
                s.append(f"{he} was married to {a['spouse']}. ")
            s.append(f"{he} {rng.choice(['studied', 'trained', 'worked for several years'])} in {rng.choice(self.cities).name} "
                     f"and was known for {rng.choice(['an austere style', 'long collaborations', 'a prolific output', 'experimental work', 'public lectures'])}. ")
            s.append(f"{'His' if a['sex'] == 'm' else 'Her'} early work was influenced by {rng.choice(self.people).name}, "
                     f"and in {a['born'][0] + rng.randint(20, 35)} {he.lower()} received the {self._word(2, 2).capitalize()} Prize. ")
            if a["died"]:
                s.append(f"{he} died in {rng.choice(self.cities).name} at the age of {a['died'][0] - a['born'][0]}. ")
            return s
        if e.kind == "film":
            return [f"{e.name} is a {a['year']} {self.entities[a['country']].attrs['demonym']} {a['genre']} directed by {a['director']}. ",
                    f"It was produced by {a['studio']} and premiered in {rng.choice(self.cities).name}. ",
                    f"The film runs {rng.randint(78, 171)} minutes and was shot in {rng.randint(20, 90)} days. ",
                    f"Critics praised its {rng.choice(['score', 'cinematography', 'ensemble cast', 'editing', 'screenplay'])}, "
                    f"and it earned {rng.randint(2, 90)} million in its first year. ",
                    f"The screenplay was adapted from a {rng.choice(['novel', 'play', 'short story', 'memoir'])} by {rng.choice(self.people).name}. "]
        if e.kind == "org":
            return [f"{e.name} is an organisation founded in {a['founded']} by {a['founder']}. ",
                    f"Its headquarters are in {a['hq']}. ",
                    f"It employs about {rng.randint(2, 90) * 10} people and is known for its {rng.choice(['archives', 'productions', 'grants', 'publications'])}. ",
                    f"In {a['founded'] + rng.randint(3, 30)} it opened a second office in {rng.choice(self.cities).name}. "]
        if e.kind == "city":
            return [f"{e.name} is a city in {a['country']}, founded in {a['founded']}. ",
                    f"It has a population of about {a['population']:,}. ",
                    f"The city lies on the {rng.choice(['river', 'coast', 'plateau', 'lake shore'])} and is known for its {rng.choice(['markets', 'bridges', 'university', 'festival', 'harbour'])}. ",
                    f"Its oldest building, the {rng.choice(_FILM_ADJ)} {rng.choice(_FILM_NOUN)}, dates from {a['founded'] + rng.randint(5, 200)}. "]
        return [f"{e.name} is a country with its capital at {rng.choice(self.cities).name}. ",
                f"Its people are called {a['demonym']}s. "]

    def context_of(self, names: Sequence[str]) -> dict[str, list]:
        return {"title": list(names), "content": [list(self.entities[n].sentences) for n in names]}

    def all_paragraphs(self) -> list[str]:
        return [e.name + "\n" + "".join(e.sentences) for e in self.entities.values()]


# ----------------------------------------------------------------------------------------------
# Questions

def _ask(world: World, qtype: str, rng: random.Random) -> dict[str, Any] | None:
    """One question of `qtype`: text, answer, gold titles (supporting order), evidence triples."""
    E = world.entities
    if qtype == "comparison":
        a, b = rng.sample(world.people, 2)
        if a.attrs["born"] == b.attrs["born"]:
            return None
        first = a if a.attrs["born"] < b.attrs["born"] else b
        return {"question": f"Who was born first, {a.name} or {b.name}?", "answer": first.name, "gold": [a.name, b.name],
                "evidences": [[a.name, "date of birth", _date(a.attrs["born"])], [b.name, "date of birth", _date(b.attrs["born"])]]}
    if qtype == "inference":
        x = rng.choice(world.people)
        y = E.get(x.attrs.get("father", ""))
        if y is None or "father" not in y.attrs:
            return None
        return {"question": f"Who is the paternal grandfather of {x.name}?", "answer": y.attrs["father"], "gold": [x.name, y.name],
                "evidences": [[x.name, "father", y.name], [y.name, "father", y.attrs["father"]]]}
    if qtype == "compositional":
        f = rng.choice(world.films)
        d = E[f.attrs["director"]]
        return {"question": f"Where was the director of film {f.name} born?", "answer": d.attrs["birthplace"], "gold": [f.name, d.name],
                "evidences": [[f.name, "director", d.name], [d.name, "place of birth", d.attrs["birthplace"]]]}
    if qtype == "bridge_comparison":
        f1, f2 = rng.sample(world.films, 2)
        d1, d2 = E[f1.attrs["director"]], E[f2.attrs["director"]]
        if d1 is d2 or not d1.attrs["died"] or not d2.attrs["died"] or d1.attrs["died"] == d2.attrs["died"]:
            return None
        first = f1 if d1.attrs["died"] < d2.attrs["died"] else f2
        return {"question": f"Which film has the director who died first, {f1.name} or {f2.name}?", "answer": first.name,
                "gold": [f1.name, d1.name, f2.name, d2.name],
                "evidences": [[f1.name, "director", d1.name], [f2.name, "director", d2.name],
                              [d1.name, "date of death", _date(d1.attrs["died"])], [d2.name, "date of death", _date(d2.attrs["died"])]]}
    if qtype == "bridge":  # HotpotQA style: a film -> its studio -> a fact about the studio
        f = rng.choice(world.films)
        s = E[f.attrs["studio"]]
        if rng.random() < 0.5:
            return {"question": f"In which city is the organisation that produced {f.name} headquartered?", "answer": s.attrs["hq"],
                    "gold": [f.name, s.name], "evidences": [[f.name, "producer", s.name], [s.name, "headquarters location", s.attrs["hq"]]]}
        return {"question": f"In what year was the organisation that produced {f.name} founded?", "answer": str(s.attrs["founded"]),
                "gold": [f.name, s.name], "evidences": [[f.name, "producer", s.name], [s.name, "inception", str(s.attrs["founded"])]]}
    if qtype == ONE_HOP:  # one relation of one entity
        relation = rng.choice(["director", "place of birth", "father", "producer"])
        if relation in ("director", "producer"):
            f = rng.choice(world.films)
            value = f.attrs["director" if relation == "director" else "studio"]
            text = f"Who directed the film {f.name}?" if relation == "director" else f"Which organisation produced the film {f.name}?"
            return {"question": text, "answer": value, "gold": [f.name], "evidences": [[f.name, relation, value]]}
        p = rng.choice(world.people)
        if relation == "father" and "father" not in p.attrs:
            return None
        value = p.attrs["birthplace" if relation == "place of birth" else "father"]
        text = f"Where was {p.name} born?" if relation == "place of birth" else f"Who is the father of {p.name}?"
        return {"question": text, "answer": value, "gold": [p.name], "evidences": [[p.name, relation, value]]}
    raise ValueError(f"unknown question type {qtype!r}; known: {QUESTION_TYPES + (ONE_HOP,)}")


def synthetic_rows(num_questions: int, *, seed: int = 0, num_paragraphs: int = 8000, own_paragraphs: int = 10,
                   types: Sequence[str] = QUESTION_TYPES, lexicon: int | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """FlashRAG-2Wiki-schema rows for `num_questions` questions, and every paragraph of the world.

    Each question's own context holds its gold paragraphs plus same-kind distractors up to
    `own_paragraphs` (HotpotQA's 2 + 8), in a seeded order. Types cycle through `types`.
    """
    world = World(num_paragraphs, seed, lexicon)
    rng = random.Random(seed * 1_000_003 + 17)
    rows: list[dict[str, Any]] = []
    asked: set[str] = set()
    pool = {"person": world.people, "film": world.films, "org": world.orgs, "city": world.cities}
    attempts = 0
    while len(rows) < num_questions:
        attempts += 1
        if attempts > 200 * max(1, num_questions):
            raise RuntimeError(f"could not generate {num_questions} distinct questions from a {num_paragraphs}-paragraph world")
        qtype = types[len(rows) % len(types)]
        q = _ask(world, qtype, rng)
        if q is None or q["question"] in asked:
            continue
        asked.add(q["question"])
        gold = list(dict.fromkeys(q["gold"]))
        kinds = [world.entities[g].kind for g in gold]
        extra: list[str] = []
        while len(gold) + len(extra) < own_paragraphs:
            cand = rng.choice(pool[rng.choice(kinds)]).name
            if cand not in gold and cand not in extra:
                extra.append(cand)
        titles = gold + extra
        rng.shuffle(titles)
        rows.append({
            "id": f"syn{seed}-{len(rows):05d}",
            "question": q["question"],
            "golden_answers": [q["answer"]],
            "metadata": {"type": qtype, "level": "synthetic", "context": world.context_of(titles),
                         "supporting_facts": {"title": gold, "sent_id": [0] * len(gold)},
                         "evidences": q["evidences"]},
        })
    return rows, world.all_paragraphs()


def synthetic_source(num_questions: int, *, seed: int = 0, num_paragraphs: int = 8000, own_paragraphs: int = 10,
                     types: Sequence[str] = QUESTION_TYPES, lexicon: int | None = None) -> tuple[list[Question], Corpus]:
    """The synthetic world as `Question`s + a `Corpus` of the whole encyclopedia."""
    rows, paragraphs = synthetic_rows(num_questions, seed=seed, num_paragraphs=num_paragraphs,
                                      own_paragraphs=own_paragraphs, types=types, lexicon=lexicon)
    return read_2wiki(rows, source=f"synthetic(seed={seed})", dataset="synthetic", extra_paragraphs=paragraphs)


def build_synthetic_eval(num_questions: int = 16, lengths: Sequence[int] = (50, 100), seed: int = 0, *,
                         workers: int = 0, num_paragraphs: int | None = None) -> list[dict[str, Any]]:
    """Eval rows for `num_questions` synthetic questions at every L in `lengths` (same questions
    at every L), ready for `parser.methods.Sample.from_record`. The world is sized to the
    largest L automatically."""
    size = num_paragraphs or max(2000, max(lengths) + 600)
    questions, corpus = synthetic_source(num_questions, seed=seed, num_paragraphs=size)
    grid = build_grid(questions, corpus, lengths, seed=seed, workers=workers)
    return [row for length in lengths for row in grid[length]]
