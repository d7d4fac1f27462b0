"""A deterministic synthetic deep-research world: entities, a page corpus and multi-hop questions.

Everything is drawn from one `numpy.random.Generator` seeded by `seed`, in a fixed order, so the
same arguments give byte-identical corpus and questions (no `hash()`, no set iteration order).

The world is made for a TINY model to learn in minutes: a closed vocabulary, short formulaic
sentences, entity names of one to three short words, a small set of relation phrases, and
questions that name their start entity verbatim:

    "What is the birthplace of the founder of the employer of Tarvo Lind?"

A k-hop question decomposes into k one-hop subtasks "What is the <relation> of <name>?", each
answered by one fact stated on one page of the corpus (the chain records which page).

Split rule (train / validation / test): the ENTITIES are partitioned into three disjoint
sub-worlds and relations never cross a partition, so every fact of a question's chain lies inside
its split's partition. Hence no test (or validation) question's chain, nor any single fact of it,
appears in any train question. All pages share one corpus (one search index), so a test question
still has to be researched among train pages, near-duplicate names and distractors.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Iterator

import numpy as np

PERSON, ORG, PLACE, WORK = "person", "org", "place", "work"
ENTITY_TYPES = (PERSON, ORG, PLACE, WORK)
SPLITS = ("train", "validation", "test")
# Optional fourth split (`sft_fraction` > 0): the entities SFT demonstrations are drawn from, kept
# apart from `train` (the RL questions). A small model memorises the facts its demonstrations
# show; with a separate partition an RL reward can only be earned by reading, as on validation.
SFT_SPLIT = "sft"
NUMBER = "number"  # object type of attribute relations (years, populations)


@dataclasses.dataclass(frozen=True)
class Relation:
    """A functional relation: every subject of `subject_type` has exactly one object."""

    phrase: str  # how questions and subtasks name it: "the <phrase> of <subject>"
    subject_type: str
    object_type: str  # an entity type, or NUMBER for an attribute
    templates: tuple[str, ...]  # fact sentences; {s} = subject name, {o} = object


RELATIONS = (
    Relation("employer", PERSON, ORG, (
        "{s} works for {o}.", "{s} is employed by {o}.", "The employer of {s} is {o}.")),
    Relation("birthplace", PERSON, PLACE, (
        "{s} was born in {o}.", "The birthplace of {s} is {o}.", "{s} grew up in {o}.")),
    Relation("birth year", PERSON, NUMBER, (
        "{s} was born in the year {o}.", "The birth year of {s} is {o}.")),
    Relation("founder", ORG, PERSON, (
        "{s} was founded by {o}.", "The founder of {s} is {o}.", "{o} founded {s}.")),
    Relation("headquarters", ORG, PLACE, (
        "{s} is headquartered in {o}.", "The headquarters of {s} is in {o}.",
        "{s} has its main office in {o}.")),
    Relation("founding year", ORG, NUMBER, (
        "{s} was founded in the year {o}.", "The founding year of {s} is {o}.")),
    Relation("mayor", PLACE, PERSON, (
        "The mayor of {s} is {o}.", "{o} is the mayor of {s}.", "{s} is led by mayor {o}.")),
    Relation("population", PLACE, NUMBER, (
        "{s} has a population of {o}.", "The population of {s} is {o}.")),
    Relation("author", WORK, PERSON, (
        "{s} was written by {o}.", "The author of {s} is {o}.", "{o} wrote {s}.")),
    Relation("publisher", WORK, ORG, (
        "{s} was published by {o}.", "The publisher of {s} is {o}.")),
    Relation("publication year", WORK, NUMBER, (
        "{s} was published in the year {o}.", "The publication year of {s} is {o}.")),
)
RELATION_BY_PHRASE = {r.phrase: r for r in RELATIONS}
# "varied": each fact in one of its relation's templates ("X works for Y", "Y founded X", ...);
# "plain": always the key-value line "X <relation> Y." ("Funer Labs founder Pivso Nol."), so the
# value is the token after the relation word on the subject's page: reading it is ONE induction
# step (attend to what followed "founder" earlier). With "X founder is Y." the value followed
# "is", which every fact line and distractor on the page shares, and a tiny model copied the
# wrong line's value (worker fact turns ~6% exact, docs/embedded_default.md).
FACT_STYLES = ("varied", "plain")


def plain_template(relation: Relation) -> str:
    return f"{{s}} {relation.phrase} {{o}}."


NUMBER_RANGES = {  # (low, high, step) per attribute
    "birth year": (1900, 2000, 1), "founding year": (1800, 2011, 1),
    "population": (1000, 99000, 1000), "publication year": (1900, 2021, 1)}

# Closed word lists: the whole corpus is written from these plus generated names.
_CONSONANTS = "bdfgklmnprstv"
_VOWELS = "aeiou"
_CODAS = ("", "", "", "n", "r", "l", "s")
_ORG_SUFFIXES = ("Labs", "Group", "Works", "Trading", "Systems", "Press", "Foods", "Bank")
_PLACE_PREFIXES = ("Port", "Lake", "Mount", "North", "South")
_WORK_ADJECTIVES = ("Silent", "Red", "Hidden", "Last", "Golden", "Quiet", "Broken", "Long",
                    "Green", "Cold", "Bright", "Lost", "Small", "Dark", "Open", "Wild")
_WORK_NOUNS = ("River", "Garden", "Tower", "Letter", "Road", "House", "Winter", "Bridge",
               "Island", "Song", "Mirror", "Door", "Field", "Harbor", "Lamp", "Forest")
_KINDS = {
    PERSON: ("an engineer", "a painter", "a teacher", "a doctor", "a farmer", "a writer",
             "a pilot", "a chemist"),
    ORG: ("a shipping company", "a software company", "a textile company", "a mining company",
          "a publishing house", "a bank", "a food company"),
    PLACE: ("a river town", "a mountain village", "a port city", "a desert town", "a lake city"),
    WORK: ("a novel", "a poem", "a play", "an essay", "a song"),
}
_HOBBIES = ("chess", "sailing", "music", "gardening", "running", "painting", "cooking", "hiking")
_FILLER_NOUNS = ("market", "festival", "library", "bridge", "museum", "harbor", "school", "park")
_FILLER_ADJECTIVES = ("busy", "quiet", "grand", "new", "large", "small", "famous", "calm")
_DISTRACTORS = (  # irrelevant sentences about the page's subject ({s}); never a relation fact
    "{s} is often mentioned in the local {noun} guide.", "{s} was featured in a {adj} report.",
    "Many readers ask about {s}.", "{s} appears in records from {year}.",
    "{s} is linked to a {adj} {noun} in {place}.", "{person} once wrote a note about {s}.")
_FILLERS = (  # noise: irrelevant sentences about anything ({place}/{person} are random names)
    "The {noun} in {place} was {adj} in {year}.", "{person} enjoys {hobby}.",
    "{person} once visited {place}.", "{person} met {person2} in {year}.",
    "Visitors say the {noun} in {place} is {adj}.", "People in {place} enjoy {hobby}.",
    "A {adj} {noun} opened in {place} in {year}.", "{person} spoke about {hobby} in {year}.")


@dataclasses.dataclass
class Entity:
    id: str
    type: str
    name: str
    kind: str  # descriptive, never asked about ("a painter")
    split: str
    facts: dict[str, str] = dataclasses.field(default_factory=dict)  # phrase -> object id/number
    fact_doc: dict[str, str] = dataclasses.field(default_factory=dict)  # phrase -> doc holding it
    twin_of: str | None = None  # near-duplicate name of that entity


@dataclasses.dataclass(frozen=True)
class Document:
    id: str
    title: str
    contents: str
    entity_id: str

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "title": self.title, "contents": self.contents})


@dataclasses.dataclass(frozen=True)
class Hop:
    subject_id: str
    subject_name: str
    relation: str  # a Relation.phrase
    object_id: str | None  # None for attributes
    answer: str  # object name or number
    doc_id: str  # the page that states this fact

    @property
    def subtask(self) -> str:
        return one_hop_question(self.relation, self.subject_name)


@dataclasses.dataclass(frozen=True)
class Question:
    id: str
    split: str
    question: str
    answer: str
    hops: tuple[Hop, ...]

    @property
    def num_hops(self) -> int:
        return len(self.hops)

    def chain_json(self) -> str:
        return json.dumps([dataclasses.asdict(h) for h in self.hops])

    def facts(self) -> tuple[tuple[str, str, str], ...]:
        return tuple((h.subject_id, h.relation, h.answer) for h in self.hops)

    def to_record(self) -> dict:
        """The flat record stored in the TFDS dataset."""
        return {"id": self.id, "question": self.question, "answer": self.answer,
                "hops": self.num_hops, "chain": self.chain_json()}


def hops_from_json(chain: str) -> tuple[Hop, ...]:
    return tuple(Hop(**h) for h in json.loads(chain))


def one_hop_question(relation: str, subject_name: str) -> str:
    return f"What is the {relation} of {subject_name}?"


def multi_hop_question(relations: list[str], start_name: str) -> str:
    """relations in chain order: ["employer", "founder"] -> 'the founder of the employer of X'."""
    phrase = start_name
    for relation in relations:
        phrase = f"the {relation} of {phrase}"
    return f"What is {phrase}?"


@dataclasses.dataclass
class World:
    seed: int
    noise: float
    entities: list[Entity]
    documents: list[Document]
    questions: dict[str, list[Question]]  # split -> questions

    def __post_init__(self):
        self._by_id = {e.id: e for e in self.entities}
        self._docs_by_id = {d.id: d for d in self.documents}

    def entity(self, entity_id: str) -> Entity:
        return self._by_id[entity_id]

    def document(self, doc_id: str) -> Document:
        return self._docs_by_id[doc_id]

    def corpus_jsonl(self) -> str:
        return "".join(d.to_json() + "\n" for d in self.documents)

    def write_corpus(self, path: str | os.PathLike) -> str:
        """Writes the corpus as JSONL ({"id","title","contents"} per line) for the search service."""
        path = os.fspath(path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(self.corpus_jsonl())
        return path

    def all_questions(self) -> Iterator[Question]:
        for split in self.questions:
            yield from self.questions[split]


def build_world(
    seed: int = 0,
    num_entities: int = 300,
    noise: float = 0.0,
    num_questions: int = 4000,
    max_hops: int = 4,
    split_fractions: tuple[float, float, float] = (0.7, 0.15, 0.15),
    near_duplicate_rate: float = 0.15,
    second_page_rate: float = 0.3,
    max_noise_sentences: int = 24,
    fact_style: str = "varied",
    sft_fraction: float = 0.0,
    name_words: int = 0,
) -> World:
    """Generates a world. `num_questions` is a target shared equally by hop counts 1..max_hops and
    by the splits in proportion to `split_fractions` (fewer when a partition has fewer chains).
    sft_fraction > 0 carves an `sft` split (that share of all entities) out of `train`; at 0 the
    world is exactly the three-split one. name_words > 0 builds every entity name from a shared
    lexicon of that many pseudo-words (so a held-out entity's name is a new combination of words
    that train names also use); at 0 each name draws fresh pseudo-words."""
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"noise must be in [0, 1], got {noise}")
    if not 1 <= max_hops <= 4:
        raise ValueError(f"max_hops must be in 1..4, got {max_hops}")
    if fact_style not in FACT_STYLES:
        raise ValueError(f"fact_style must be one of {FACT_STYLES}, got {fact_style!r}")
    if not 0.0 <= sft_fraction < split_fractions[0]:
        raise ValueError(f"sft_fraction must be in [0, {split_fractions[0]}) (it is taken from "
                         f"the train share), got {sft_fraction}")
    splits = SPLITS
    if sft_fraction > 0:
        splits = SPLITS + (SFT_SPLIT,)
        split_fractions = (split_fractions[0] - sft_fraction, *split_fractions[1:], sft_fraction)
    if name_words < 0 or 0 < name_words < 20:
        raise ValueError(f"name_words must be 0 (fresh words) or >= 20, got {name_words}")
    if num_entities < 40:
        raise ValueError(f"num_entities must be >= 40 (each split needs every type), got {num_entities}")
    # Independent streams, so the noise knob changes only the noise sentences: the same seed
    # gives the same entities, facts, page layout, doc ids and questions at every noise level.
    world_rng, page_rng, noise_rng, question_rng = (
        np.random.default_rng([seed, stream]) for stream in range(4))
    # The lexicon has its own stream: name_words=0 worlds draw exactly what they always drew.
    lexicon = _lexicon(np.random.default_rng([seed, 4]), name_words) if name_words else None
    entities = _make_entities(world_rng, num_entities, splits, split_fractions,
                              near_duplicate_rate, lexicon)
    _assign_facts(world_rng, entities, splits)
    documents = _write_pages(page_rng, noise_rng, entities, noise, second_page_rate,
                             max_noise_sentences, fact_style)
    questions = _make_questions(question_rng, entities, num_questions, max_hops, splits,
                                split_fractions)
    return World(seed=seed, noise=noise, entities=entities, documents=documents,
                 questions=questions)


# ---------------------------------------------------------------------------------------- names
def _pseudo_word(rng: np.random.Generator, syllables: int = 2) -> str:
    parts = [_CONSONANTS[rng.integers(len(_CONSONANTS))] + _VOWELS[rng.integers(len(_VOWELS))]
             + _CODAS[rng.integers(len(_CODAS))] for _ in range(syllables)]
    return "".join(parts).capitalize()


def _lexicon(rng: np.random.Generator, size: int) -> list[str]:
    """`size` distinct pseudo-words of 1-3 syllables, the shared stock of name words."""
    words: dict[str, None] = {}
    while len(words) < size:
        words.setdefault(_pseudo_word(rng, 1 + int(rng.integers(3))))
    return list(words)


def _fresh_name(rng: np.random.Generator, entity_type: str, taken: set[str],
                lexicon: list[str] | None = None) -> str:
    def word(syllables: int = 2) -> str:
        return lexicon[rng.integers(len(lexicon))] if lexicon else _pseudo_word(rng, syllables)

    for _ in range(1000):
        if entity_type == PERSON:
            name = f"{word()} {word(1 + int(rng.integers(2)))}"
        elif entity_type == ORG:
            name = f"{word()} {_ORG_SUFFIXES[rng.integers(len(_ORG_SUFFIXES))]}"
        elif entity_type == PLACE:
            name = word(2 + int(rng.integers(2)))
            if rng.random() < 0.3:
                name = f"{_PLACE_PREFIXES[rng.integers(len(_PLACE_PREFIXES))]} {name}"
        else:
            first = (_WORK_ADJECTIVES[rng.integers(len(_WORK_ADJECTIVES))] if rng.random() < 0.7
                     else word())
            name = f"The {first} {_WORK_NOUNS[rng.integers(len(_WORK_NOUNS))]}"
        if name not in taken:
            return name
    raise RuntimeError(f"could not draw a fresh {entity_type} name")


def _near_duplicate(rng: np.random.Generator, name: str, taken: set[str]) -> str | None:
    """One small edit to the last word ("Tarvo Lind" -> "Tarvo Lindt"), the classic confuser."""
    words = name.split(" ")
    last = words[-1]
    edits = [last + "t", last + "s", last + "e", last[:-1] + last[-1] * 2]
    if last[-1] in _VOWELS:
        edits.append(last[:-1] + _VOWELS[(_VOWELS.index(last[-1]) + 1) % len(_VOWELS)])
    for i in rng.permutation(len(edits)):
        candidate = " ".join(words[:-1] + [edits[i]])
        if candidate not in taken:
            return candidate
    return None


def _make_entities(rng, num_entities, splits, split_fractions,
                   near_duplicate_rate, lexicon=None) -> list[Entity]:
    # 40% people (most relations point at people), 20% each of the rest.
    counts = {PERSON: int(0.4 * num_entities), ORG: int(0.2 * num_entities),
              PLACE: int(0.2 * num_entities)}
    counts[WORK] = num_entities - sum(counts.values())
    fractions = np.asarray(split_fractions, dtype=np.float64)
    fractions = fractions / fractions.sum()
    entities: list[Entity] = []
    taken: set[str] = set()
    for entity_type in ENTITY_TYPES:
        n = counts[entity_type]
        # Every split gets at least 3 entities of every type so it is a closed sub-world.
        per_split = np.maximum(np.floor(fractions * n).astype(int), 3)
        per_split[0] = n - per_split[1:].sum()
        num_twins = int(round(near_duplicate_rate * n))
        split_of = np.repeat(np.arange(len(splits)), per_split)
        rng.shuffle(split_of)
        originals: list[Entity] = []
        for i in range(n):
            twin_source = (originals[int(rng.integers(len(originals)))]
                           if i >= n - num_twins and originals else None)
            name = _near_duplicate(rng, twin_source.name, taken) if twin_source else None
            if name is None:
                name, twin_source = _fresh_name(rng, entity_type, taken, lexicon), None
            taken.add(name)
            kinds = _KINDS[entity_type]
            entity = Entity(id="", type=entity_type, name=name, split=splits[split_of[i]],
                            kind=kinds[rng.integers(len(kinds))],
                            twin_of=twin_source.id if twin_source else None)
            entity.id = f"e{len(entities):05d}"
            entities.append(entity)
            if twin_source is None:
                originals.append(entity)
    return entities


# ---------------------------------------------------------------------------------------- facts
def _assign_facts(rng: np.random.Generator, entities: list[Entity], splits) -> None:
    pools = {(split, t): [e for e in entities if e.split == split and e.type == t]
             for split in splits for t in ENTITY_TYPES}
    for entity in entities:
        for relation in RELATIONS:
            if relation.subject_type != entity.type:
                continue
            if relation.object_type == NUMBER:
                low, high, step = NUMBER_RANGES[relation.phrase]
                entity.facts[relation.phrase] = str(int(rng.integers(low // step, high // step)) * step)
            else:
                pool = pools[(entity.split, relation.object_type)]
                entity.facts[relation.phrase] = pool[int(rng.integers(len(pool)))].id


# ---------------------------------------------------------------------------------------- pages
def _fill(template: str, rng: np.random.Generator, names: dict[str, list[str]], **known) -> str:
    def pick(seq):
        return seq[int(rng.integers(len(seq)))]
    values = dict(noun=pick(_FILLER_NOUNS), adj=pick(_FILLER_ADJECTIVES), hobby=pick(_HOBBIES),
                  year=str(int(rng.integers(1900, 2021))), place=pick(names[PLACE]),
                  person=pick(names[PERSON]), person2=pick(names[PERSON]))
    values.update(known)
    return template.format(**values)


def _write_pages(rng, noise_rng, entities, noise, second_page_rate, max_noise_sentences,
                 fact_style: str = "varied") -> list[Document]:
    names = {t: [e.name for e in entities if e.type == t] for t in ENTITY_TYPES}
    by_id = {e.id: e for e in entities}
    documents: list[Document] = []
    for entity in entities:
        phrases = list(entity.facts)
        rng.shuffle(phrases)
        # Some entities get a second page with the same title: a worker must pick the page whose
        # text holds the fact, not just the first page about the right name.
        num_pages = 2 if (len(phrases) >= 2 and rng.random() < second_page_rate) else 1
        cut = int(rng.integers(1, len(phrases))) if num_pages == 2 else len(phrases)
        for page, page_phrases in enumerate((phrases[:cut], phrases[cut:])[:num_pages]):
            documents.append(write_page(
                rng, noise_rng, entity, page_phrases, page, names,
                lambda value, relation: value if relation.object_type == NUMBER
                else by_id[value].name, noise, max_noise_sentences, fact_style))
    return documents


def write_page(rng, noise_rng, entity: Entity, page_phrases, page: int, names, object_name,
               noise: float, max_noise_sentences: int, fact_style: str) -> Document:
    """Page `page` (0: the first) of `entity`, stating the facts `page_phrases`, with distractors
    and noise; records in entity.fact_doc where each fact is. object_name(value, relation): how a
    fact's object reads. Also writes the random-fact pages of the reading tasks
    (data/reading_tasks.py), so those read exactly like the world's."""
    # The page id names its entity, as a wiki URL does ("page Tarvo Lind", a second page
    # "page Tarvo Lind (2)"): opening the right page means repeating the entity's name,
    # not a number. The leading word puts the name after a space inside the JSON string,
    # so it is the same tokens as everywhere else (a tiny model copies token for token).
    doc_id = f"page {entity.name}" + (f" ({page + 1})" if page else "")
    sentences = [f"{entity.name} is {entity.kind}." if page == 0
                 else f"More about {entity.name}, {entity.kind}."]
    body = []
    for phrase in page_phrases:
        relation = RELATION_BY_PHRASE[phrase]
        obj = object_name(entity.facts[phrase], relation)
        template = relation.templates[int(rng.integers(len(relation.templates)))]
        if fact_style == "plain":  # drawn anyway: the rest of the page stays the same
            template = plain_template(relation)
        body.append(template.format(s=entity.name, o=obj))
        entity.fact_doc[phrase] = doc_id
    for _ in range(2):
        body.append(_fill(_DISTRACTORS[int(rng.integers(len(_DISTRACTORS)))], rng, names,
                          s=entity.name))
    order = rng.permutation(len(body))
    sentences += [body[i] for i in order]
    # noise: irrelevant sentences (mean noise * max_noise_sentences), spliced in at random
    # places so the facts do not sit at a fixed position.
    num_noise = int(noise_rng.binomial(2 * max_noise_sentences, noise / 2)) if noise else 0
    for _ in range(num_noise):
        filler = _fill(_FILLERS[int(noise_rng.integers(len(_FILLERS)))], noise_rng, names)
        sentences.insert(1 + int(noise_rng.integers(len(sentences))), filler)
    return Document(id=doc_id, title=entity.name, contents=" ".join(sentences),
                    entity_id=entity.id)


# ------------------------------------------------------------------------------------ questions
def _chains_from(start: Entity, by_id: dict[str, Entity], max_hops: int) -> Iterator[list[str]]:
    """All relation paths from `start` of 1..max_hops hops that never revisit an entity (so an
    answer is never the start itself); attributes end a path."""
    def walk(entity: Entity, path: list[str], seen: tuple[str, ...]):
        for phrase in sorted(entity.facts):
            relation = RELATION_BY_PHRASE[phrase]
            if relation.object_type == NUMBER:
                yield path + [phrase]
                continue
            target = by_id[entity.facts[phrase]]
            if target.id in seen:
                continue
            yield path + [phrase]
            if len(path) + 1 < max_hops:
                yield from walk(target, path + [phrase], seen + (target.id,))
    yield from walk(start, [], (start.id,))


def _resolve(start: Entity, path: list[str], by_id: dict[str, Entity]) -> tuple[Hop, ...]:
    hops, entity = [], start
    for phrase in path:
        value = entity.facts[phrase]
        is_number = RELATION_BY_PHRASE[phrase].object_type == NUMBER
        answer = value if is_number else by_id[value].name
        hops.append(Hop(subject_id=entity.id, subject_name=entity.name, relation=phrase,
                        object_id=None if is_number else value, answer=answer,
                        doc_id=entity.fact_doc[phrase]))
        if not is_number:
            entity = by_id[value]
    return tuple(hops)


def _make_questions(rng, entities, num_questions, max_hops, splits, split_fractions):
    by_id = {e.id: e for e in entities}
    fractions = np.asarray(split_fractions, dtype=np.float64) / sum(split_fractions)
    questions: dict[str, list[Question]] = {}
    for split, fraction in zip(splits, fractions):
        by_hops: dict[int, list[tuple[Entity, list[str]]]] = {k: [] for k in range(1, max_hops + 1)}
        for entity in entities:
            if entity.split == split:
                for path in _chains_from(entity, by_id, max_hops):
                    by_hops[len(path)].append((entity, path))
        quota = max(1, int(round(num_questions * fraction / max_hops)))
        chosen: list[Question] = []
        for k in range(1, max_hops + 1):
            candidates = by_hops[k]
            for i in sorted(rng.permutation(len(candidates))[:quota]):
                start, path = candidates[i]
                hops = _resolve(start, path, by_id)
                chosen.append(Question(id="", split=split,
                                       question=multi_hop_question(path, start.name),
                                       answer=hops[-1].answer, hops=hops))
        order = rng.permutation(len(chosen))  # mix hop counts within the split
        questions[split] = [dataclasses.replace(chosen[i], id=f"{split}-{n:05d}")
                            for n, i in enumerate(order)]
    return questions


def world_statistics(world: World) -> dict:
    """Sizes a reader wants to see: corpus size, words per page, questions per split and hops."""
    words = np.array([len(d.contents.split()) for d in world.documents])
    return {
        "entities": len(world.entities), "documents": len(world.documents),
        "words_per_page": {"mean": float(words.mean()), "min": int(words.min()),
                           "max": int(words.max())},
        "questions": {split: {k: sum(q.num_hops == k for q in qs) for k in range(1, 5)}
                      for split, qs in world.questions.items()},
    }
