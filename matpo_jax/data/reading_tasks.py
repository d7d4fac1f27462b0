"""Reading tasks: what the embedded default's warm start is pretrained on.

A real Qwen3 checkpoint can read before RL; a tiny model trained from scratch cannot, and SFT on
the roles' protocol alone leaves it reading the right value off an opened page in about one fact
turn of five (docs/embedded_default.md). These tasks teach only reading, on pages written exactly
as the world writes them (synthetic_world.write_page: same templates, distractor and noise
sentences, page ids), but with RANDOM facts: every page is a fresh draw of which object each of
its subject's relations points to, over the world's own names. So the model learns to find a
subject's relation on a page and copy its value, and cannot learn any fact of the world (in
particular none of the validation or test questions' facts).

Three kinds, each a question before the page(s) as a worker's subtask comes before its tool
output, and fact lines in the worker's own words ("Fact: <subject> <relation> <value>."):
- `one_hop`: one page (sometimes a second page about another subject of the same type, as a
  search listing shows two), one or two questions about it;
- `two_hop`: "What is the <r2> of the <r1> of <s>?" over the two pages of the chain, in either
  order, answered by both fact lines then "Answer: <value>.";
- `listing` (off unless `listing_fraction` > 0): a worker's choice among search results. The
  question, then a two-result listing exactly as the search tool renders it (title, quoted id,
  the query's best sentences), where the other result is the subject's second page, a
  near-duplicate name's page, or another subject's page, in either order; answered by the open
  call of the page that states the fact, then its fact line (which the snippet shows).
Only the fact, answer and open lines are trained (`trainable`).
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np

from matpo_jax.data import synthetic_world as world_lib
from matpo_jax.data.synthetic_world import NUMBER, NUMBER_RANGES, RELATIONS, Entity
from matpo_jax.tools.clients import render_hits
from matpo_jax.tools.search_server import snippet

KINDS = ("one_hop", "two_hop", "listing")
LISTING_OTHERS = ("second_page", "twin", "other_subject")  # what the other result is
MAX_NOISE_SENTENCES = 24  # the world's default (build_world)


@dataclasses.dataclass(frozen=True)
class ReadingExample:
    kind: str
    segments: tuple[tuple[str, bool], ...]  # (text, trained) in order; tokenized piece by piece
    subject: str  # the first fact line's subject, relation and value (reading accuracy is
    relation: str  # measured on that line)
    answer: str

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.segments)


class ReadingTaskWriter:
    """Draws reading examples over a world's names; a pure function of (seed, index)."""

    def __init__(self, entities: list[Entity], *, seed: int, noise: tuple[float, float],
                 fact_style: str = "plain", max_response_chars: int = 0,
                 two_hop_fraction: float = 0.3, distractor_rate: float = 0.5,
                 listing_fraction: float = 0.0):
        self.entities = list(entities)
        self.names = {t: [e.name for e in self.entities if e.type == t]
                      for t in world_lib.ENTITY_TYPES}
        self.by_name = {e.name: e for e in self.entities}
        self.by_type = {t: [e for e in self.entities if e.type == t] for t in world_lib.ENTITY_TYPES}
        self.seed = seed
        self.noise = noise  # each page's noise level is drawn uniformly from this range
        self.fact_style = fact_style
        self.max_response_chars = max_response_chars  # the open tool's cap; 0: whole pages
        self.two_hop_fraction = two_hop_fraction
        self.distractor_rate = distractor_rate
        self.listing_fraction = listing_fraction
        by_id = {e.id: e for e in self.entities}
        # near-duplicate names, both ways round ("Fonra Foods" / "Fonra Foodst")
        self.twins = [(e, by_id[e.twin_of]) for e in self.entities if e.twin_of in by_id]
        self.twins += [(b, a) for a, b in self.twins]
        self.relations = {t: [r for r in RELATIONS if r.subject_type == t]
                          for t in world_lib.ENTITY_TYPES}
        # Subjects of two-hop chains: types with a relation whose object is an entity that
        # itself has relations.
        self.chain_starts = [e for e in self.entities if any(
            r.object_type != NUMBER and self.relations[r.object_type]
            for r in self.relations[e.type])]

    # ------------------------------------------------------------------------------- pages
    def _random_value(self, rng: np.random.Generator, relation) -> str:
        if relation.object_type == NUMBER:
            low, high, step = NUMBER_RANGES[relation.phrase]
            return str(int(rng.integers(low // step, high // step + 1)) * step)
        names = self.names[relation.object_type]
        return names[int(rng.integers(len(names)))]

    def _subject(self, rng: np.random.Generator, entity: Entity,
                 fixed: dict[str, str] | None = None) -> Entity:
        """A copy of `entity` whose every relation points to a random object (names, not ids)."""
        facts = {r.phrase: self._random_value(rng, r) for r in self.relations[entity.type]}
        facts.update(fixed or {})
        return dataclasses.replace(entity, facts=facts, fact_doc={})

    def _write_page(self, rng: np.random.Generator, subject: Entity, phrases: list[str],
                    page: int, noise: float):
        """The world's page writer on the subject's facts as drawn (values are names already)."""
        return world_lib.write_page(rng, rng, subject, phrases, page, self.names,
                                    lambda value, relation: value, noise, MAX_NOISE_SENTENCES,
                                    self.fact_style)

    def _page(self, rng: np.random.Generator, subject: Entity,
              must_show: tuple[str, ...] = ()) -> tuple[str, list[str]]:
        """The subject's page as the open tool shows it ("id | title\ncontents", capped), and the
        phrases whose fact lines survive the cap; redrawn until one does (and `must_show` do)."""
        phrases = list(subject.facts)
        for _ in range(16):
            rng.shuffle(phrases)
            noise = float(rng.uniform(*self.noise))
            doc = self._write_page(rng, subject, phrases, int(rng.random() < 0.3), noise)
            text = f"{doc.id} | {doc.title}\n{doc.contents}"
            if self.max_response_chars:
                text = text[: self.max_response_chars]
            shown = [p for p in phrases if self._fact(subject, p) in text]
            if shown and all(p in shown for p in must_show):
                return text, shown
        raise RuntimeError(f"no page of {subject.name} shows a fact ({', '.join(must_show)}) "
                           f"within {self.max_response_chars} characters")

    def _fact(self, subject: Entity, phrase: str) -> str:
        relation = world_lib.RELATION_BY_PHRASE[phrase]
        return world_lib.plain_template(relation).format(s=subject.name, o=subject.facts[phrase])

    # ---------------------------------------------------------------------------- examples
    def example(self, index: int) -> ReadingExample:
        rng = np.random.default_rng([self.seed, index])
        # drawn only when on, so the other kinds' streams (the committed warm start's) stay put
        if self.listing_fraction and rng.random() < self.listing_fraction:
            return self._listing(rng)
        if rng.random() < self.two_hop_fraction and self.chain_starts:
            return self._two_hop(rng)
        return self._one_hop(rng)

    def _one_hop(self, rng: np.random.Generator) -> ReadingExample:
        entity = self.entities[int(rng.integers(len(self.entities)))]
        subject = self._subject(rng, entity)
        page, shown = self._page(rng, subject)
        asked = shown[: 1 + int(rng.random() < 0.5)]
        pages = [page]
        if rng.random() < self.distractor_rate:  # another subject of the same type, same relations
            same_type = self.by_type[entity.type]
            other = same_type[int(rng.integers(len(same_type)))]
            if other.id != entity.id:
                pages.insert(int(rng.integers(2)), self._page(rng, self._subject(rng, other))[0])
        segments = [(f"What is the {asked[0]} of {subject.name}?\n", False),
                    *[(page + "\n", False) for page in pages]]
        for k, phrase in enumerate(asked):
            if k:
                segments.append((f"What is the {phrase} of {subject.name}?\n", False))
            segments.append((f"Fact: {self._fact(subject, phrase)}\n", True))
        return ReadingExample("one_hop", tuple(segments), subject.name, asked[0],
                              subject.facts[asked[0]])

    def _two_hop(self, rng: np.random.Generator) -> ReadingExample:
        entity = self.chain_starts[int(rng.integers(len(self.chain_starts)))]
        first_relations = [r for r in self.relations[entity.type]
                           if r.object_type != NUMBER and self.relations[r.object_type]]
        r1 = first_relations[int(rng.integers(len(first_relations)))]
        subject = self._subject(rng, entity)
        middle_name = subject.facts[r1.phrase]
        middle_entity = self.by_name[middle_name]
        middle = self._subject(rng, middle_entity)
        r2 = self.relations[middle.type][int(rng.integers(len(self.relations[middle.type])))]
        pages = [self._page(rng, subject, (r1.phrase,))[0], self._page(rng, middle, (r2.phrase,))[0]]
        if rng.random() < 0.5:
            pages.reverse()
        value = middle.facts[r2.phrase]
        segments = [(f"What is the {r2.phrase} of the {r1.phrase} of {subject.name}?\n", False),
                    *[(page + "\n", False) for page in pages],
                    (f"Fact: {self._fact(subject, r1.phrase)}\n", True),
                    (f"Fact: {self._fact(middle, r2.phrase)}\n", True),
                    (f"Answer: {value}.\n", True)]
        return ReadingExample("two_hop", tuple(segments), subject.name, r1.phrase, middle_name)

    def _listing(self, rng: np.random.Generator) -> ReadingExample:
        other_kind = LISTING_OTHERS[int(rng.integers(len(LISTING_OTHERS)))]
        if other_kind == "twin" and not self.twins:
            other_kind = "other_subject"
        if other_kind == "twin":
            entity, other_entity = self.twins[int(rng.integers(len(self.twins)))]
        else:
            entity = self.entities[int(rng.integers(len(self.entities)))]
            if other_kind == "second_page" and len(self.relations[entity.type]) < 2:
                other_kind = "other_subject"
        subject = self._subject(rng, entity)
        noise = float(rng.uniform(*self.noise))
        if other_kind == "second_page":  # the facts split over "page X" and "page X (2)"
            phrases = list(subject.facts)
            rng.shuffle(phrases)
            cut = int(rng.integers(1, len(phrases)))
            docs = [self._write_page(rng, subject, part, page, noise)
                    for page, part in enumerate((phrases[:cut], phrases[cut:]))]
            right = int(rng.integers(2))  # the page stating the asked fact
            on_right = [p for p in phrases if subject.fact_doc[p] == docs[right].id]
            phrase = on_right[int(rng.integers(len(on_right)))]
            right_doc, other_doc = docs[right], docs[1 - right]
        else:
            phrases = list(subject.facts)
            phrase = phrases[int(rng.integers(len(phrases)))]
            if other_kind == "other_subject":
                same_type = [e for e in self.by_type[entity.type] if e.id != entity.id]
                other_entity = same_type[int(rng.integers(len(same_type)))]
            other = self._subject(rng, other_entity)
            right_doc, other_doc = (self._write_page(rng, who, list(who.facts), 0, noise)
                                    for who in (subject, other))
        query = f"the {phrase} of {subject.name}"  # the worker's first search (oracle.hop_queries)
        results = [right_doc, other_doc]
        if rng.random() < 0.5:  # either order: the choice is read, not the rank
            results.reverse()
        listing = render_hits(query, [(d.title, d.id, snippet(d.contents, query)) for d in results])
        call = json.dumps({"name": "open", "arguments": {"id": right_doc.id}})  # as a worker calls
        return ReadingExample("listing", (
            (f"What is the {phrase} of {subject.name}?\n", False), (listing + "\n", False),
            (call + "\n", True), (f"Fact: {self._fact(subject, phrase)}\n", True)),
            subject.name, phrase, right_doc.id)
