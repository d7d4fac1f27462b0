"""The TFDS builders of the published benchmarks, on small files written in their published
formats (tests/data/fixtures/<name>/): every field, splits, configs, and errors that name the
file (and line) at fault."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import requests
import tensorflow_datasets as tfds

import matpo_jax.data  # noqa: F401  (registers the builders)
from matpo_jax.data import frames, gaia, loader, musique, published, webwalkerqa
from matpo_jax.tools.search_server import SearchServer, load_corpus

FIXTURES = Path(__file__).parent / "fixtures"


def rows(builder, split):
    source = builder.as_data_source()[split]
    return [loader.decode_record(source[i]) for i in range(len(source))]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tfds")


def test_builders_are_registered_on_import():
    from tensorflow_datasets.core import registered
    assert {"musique", "frames", "webwalkerqa", "gaia"} <= set(registered.list_imported_builders())
    assert tfds.builder_cls("webwalkerqa") is webwalkerqa.Webwalkerqa
    assert [c.name for c in musique.Musique.BUILDER_CONFIGS] == ["ans", "full"]
    assert [c.name for c in gaia.Gaia.BUILDER_CONFIGS] == ["text", "all"]


# ------------------------------------------------------------------------------------- MuSiQue

def test_musique_ans_every_field(data_dir):
    builder = musique.prepare_dataset("ans", manual_dir=FIXTURES / "musique", data_dir=data_dir)
    assert builder.info.full_name == "musique/ans/1.0.0"
    train, validation = rows(builder, "train"), rows(builder, "validation")
    assert [r["id"] for r in train] == ["2hop__460946_294723", "3hop1__9988_1234_5678",
                                        "4hop2__1_2_3_4"]  # file order
    assert [r["hops"] for r in train] == [2, 3, 4]
    assert [r["id"] for r in validation] == ["2hop__111_222", "3hop2__5_6_7"]
    first = train[0]
    assert first["question"] == "Who is the spouse of the Green performer?"
    # answer first, then the aliases; an alias equal to the answer is not repeated
    assert first["answers"] == ["Miquette Giraudy", "M. Giraudy"]
    assert first["answerable"] is True
    assert first["paragraphs"] == {
        "title": ["Green (Steve Hillage album)", "Miquette Giraudy", "Lyon"],
        "text": ["Green is the fourth studio album by Steve Hillage, released in 1978.",
                 "Miquette Giraudy (born 1953) is a French keyboard player and the partner of "
                 "Steve Hillage.", "Lyon is the third-largest city of France."],
        "is_supporting": [True, True, False]}
    assert [step["answer"] for step in json.loads(first["decomposition"])] == [
        "Steve Hillage", "Miquette Giraudy"]
    assert train[2]["answers"] == ["Zürich", "Zurich"]  # non-ASCII survives
    assert validation[0]["answers"] == ["guitar", "electric guitar"]


def test_musique_full_leaves_unanswerable_rows_out_unless_asked(data_dir):
    full = musique.prepare_dataset("full", manual_dir=FIXTURES / "musique", data_dir=data_dir)
    assert [r["id"] for r in rows(full, "train")] == ["2hop__460946_294723",
                                                      "3hop1__9988_1234_5678"]
    assert all(r["answerable"] for r in rows(full, "train") + rows(full, "validation"))
    both = musique.prepare_dataset(musique.make_config("full", include_unanswerable=True),
                                   manual_dir=FIXTURES / "musique", data_dir=data_dir)
    train = rows(both, "train")
    assert [(r["id"], r["answerable"]) for r in train] == [
        ("2hop__460946_294723", True), ("2hop__460946_294723__unanswerable", False),
        ("3hop1__9988_1234_5678", True), ("3hop1__9988_1234_5678__unanswerable", False)]
    assert not any(train[1]["paragraphs"]["is_supporting"])  # the twin lost its support
    assert len(rows(both, "validation")) == 2


def test_musique_paragraph_corpus_is_deduplicated_and_served(data_dir, tmp_path):
    builder = musique.prepare_dataset("ans", manual_dir=FIXTURES / "musique", data_dir=data_dir)
    docs = load_corpus(musique.corpus_path(builder))  # the search service's own reader
    distinct = {(p["title"], p["paragraph_text"])
                for name in ("train", "dev")
                for line in (FIXTURES / "musique" / f"musique_ans_v1.0_{name}.jsonl").open()
                for p in json.loads(line)["paragraphs"]}
    assert len(docs) == len(distinct) == 8
    assert {(d.title, d.contents) for d in docs} == distinct
    lyon = [d for d in docs if d.title == "Lyon"]
    assert [d.id for d in lyon] == ["Lyon", "Lyon (2)"]  # same title, another paragraph
    # The export without a build writes the same corpus.
    exported = tmp_path / "paragraphs.jsonl"
    assert musique.export_paragraph_corpus(FIXTURES / "musique", exported) == 8
    assert exported.read_text() == Path(musique.corpus_path(builder)).read_text()
    with SearchServer(exported) as server:
        hits = requests.post(f"{server.url}/search", json={"q": "Rhone Glacier Switzerland",
                                                           "num": 2}, timeout=10).json()
        assert hits["organic"][0]["link"] == "Rhone"
        page = requests.post(f"{server.url}/page", json={"id": "Lyon (2)"}, timeout=10).json()
        assert page["contents"] == "Lyon lies at the confluence of the Rhone and the Saone."


# ------------------------------------------------------------------------------------- FRAMES

def test_frames_fields_with_and_without_the_index_column(data_dir, tmp_path):
    builder = frames.prepare_dataset(manual_dir=FIXTURES / "frames", data_dir=data_dir)
    assert list(builder.info.splits) == ["test"]
    records = rows(builder, "test")
    assert [r["id"] for r in records] == ["frames-0", "frames-1", "frames-2"]
    assert records[0]["answers"] == ["Jane Ballou"]
    assert records[1]["reasoning_types"] == ["Numerical reasoning", "Temporal reasoning"]
    assert records[1]["wiki_links"] == ["https://en.wikipedia.org/wiki/Punxsutawney_Phil"]
    assert records[2]["wikipedia_links"] == [
        "https://en.wikipedia.org/wiki/Oslo", "https://en.wikipedia.org/wiki/Norway",
        "https://en.wikipedia.org/wiki/Tabular"]
    assert records[2]["wiki_links"] == records[2]["wikipedia_links"]
    # a quoted cell keeps its tab and line break
    assert records[2]["question"].startswith('As of August 1, 2024, which country is home to '
                                             'the "Tab\tCity"?\nA question')
    # The same file without pandas' index column reads the same (ids from row positions).
    lines = (FIXTURES / "frames" / "test.tsv").read_text().split("\n")
    stripped = [line.split("\t", 1)[1] if "\t" in line and line[:1] in "0123456789\t" else line
                for line in lines]
    (tmp_path / "noindex").mkdir()
    (tmp_path / "noindex" / "test.tsv").write_text("\n".join(stripped))
    no_index = frames.prepare_dataset(manual_dir=tmp_path / "noindex",
                                      data_dir=tmp_path / "tfds")
    assert rows(no_index, "test") == records


# ------------------------------------------------------------------------------------- WebWalkerQA

def test_webwalkerqa_both_schemas_and_both_layouts(data_dir, tmp_path):
    builder = webwalkerqa.prepare_dataset(manual_dir=FIXTURES / "webwalkerqa", data_dir=data_dir)
    main, silver = rows(builder, "main"), rows(builder, "silver")
    assert [r["id"] for r in main] == [f"webwalkerqa-main-0000{i}" for i in range(3)]
    assert main[1] == {
        "id": "webwalkerqa-main-00001",
        "question": "Which two cities host the conference's satellite events, and when do "
                    "they start?",
        "answers": ["Vienna and Graz, July 27"], "root_url": "https://2025.aclweb.org/",
        "domain": "conference", "lang": "en", "type": "multi_source", "difficulty_level": "hard",
        "source_website": ["https://2025.aclweb.org/venue/", "https://2025.aclweb.org/program/"],
        "golden_path": ["root->venue", "root->program"]}
    assert main[2]["source_website"] == ["https://example.org/about"]  # a lone string
    assert main[2]["answers"] == ["北京"]
    # the first release's capitalised keys (silver row 0) read into the same fields
    assert silver[0] == {
        "id": "webwalkerqa-silver-00000", "question": "Where will ACL 2025 be held?",
        "answers": ["Vienna"], "root_url": "https://2025.aclweb.org/", "domain": "Conference",
        "lang": "English", "type": "single-source", "difficulty_level": "Easy",
        "source_website": ["https://2025.aclweb.org/venue/"], "golden_path": ["root->venue"]}
    # Files at the top of the manual dir; without the silver file there is only `main`.
    top = tmp_path / "top"
    top.mkdir()
    shutil.copy(FIXTURES / "webwalkerqa" / "data" / "main-00000-of-00001.jsonl", top)
    only_main = webwalkerqa.prepare_dataset(manual_dir=top, data_dir=tmp_path / "tfds")
    assert list(only_main.info.splits) == ["main"]
    assert rows(only_main, "main") == main


# ------------------------------------------------------------------------------------- GAIA

def test_gaia_text_and_all_configs_with_levels_as_ints(data_dir):
    text = gaia.prepare_dataset("text", manual_dir=FIXTURES / "gaia", data_dir=data_dir)
    records = rows(text, "validation")
    assert [(r["id"][:8], r["level"]) for r in records] == [
        ("c61d22de", 2), ("17b5a6a3", 1), ("8e867cd7", 3)]  # Level 2, "1", "3.0"
    assert all(r["file_name"] == "" for r in records)
    assert records[1]["answers"] == ["3"]
    assert json.loads(records[1]["annotator_metadata"])["Number of steps"] == "3"
    everything = rows(gaia.prepare_dataset("all", manual_dir=FIXTURES / "gaia",
                                           data_dir=data_dir), "validation")
    assert len(everything) == 4
    assert everything[2]["file_name"] == "32102e3e-d12a-4209-9163-7b3a104efe5d.xlsx"


def test_gaia_text_task_ids_select_exactly_the_listed_questions(tmp_path):
    manual = tmp_path / "gaia"
    shutil.copytree(FIXTURES / "gaia", manual)
    (manual / "text_task_ids.txt").write_text(
        "# the text subset\n8e867cd7-cff9-4e6c-867a-ff5ddc2550be\n\n"
        "32102e3e-d12a-4209-9163-7b3a104efe5d\n")
    records = rows(gaia.prepare_dataset("text", manual_dir=manual, data_dir=tmp_path / "a"),
                   "validation")
    # exactly the listed ids (a listed question with a file included), in the metadata's order
    assert [r["id"][:8] for r in records] == ["32102e3e", "8e867cd7"]
    (manual / "text_task_ids.txt").write_text("8e867cd7-cff9-4e6c-867a-ff5ddc2550be\nno-such-id\n")
    with pytest.raises(published.DatasetRowError, match=r"text_task_ids.txt:2: task id "
                                                        r"'no-such-id' is not in"):
        gaia.prepare_dataset("text", manual_dir=manual, data_dir=tmp_path / "b")


# ------------------------------------------------------------------------------------- errors

@pytest.mark.parametrize("module, config, files, expected", [
    (musique, "ans", ["musique_ans_v1.0_train.jsonl"], "musique_ans_v1.0_dev.jsonl"),
    (musique, "full", ["musique_ans_v1.0_train.jsonl"], "musique_full_v1.0_train.jsonl"),
    (frames, None, [], "."),  # an empty manual dir
    (webwalkerqa, None, ["silver-00000-of-00001.jsonl"], "main-00000-of-00001.jsonl"),
    (gaia, "text", ["metadata.jsonl"], "2023/validation/metadata.jsonl"),
])
def test_a_missing_file_is_one_line_naming_its_path_and_source(tmp_path, module, config, files,
                                                               expected):
    manual = tmp_path / "manual"
    manual.mkdir()
    for name in files:  # files that are not the ones needed
        (manual / name).write_text("{}\n")
    with pytest.raises(published.DatasetFileError) as error:
        module.prepare_dataset(config, manual_dir=manual, data_dir=tmp_path / "tfds")
    message = str(error.value)
    assert "\n" not in message
    assert str((manual / expected).resolve() if expected != "." else manual) in message
    assert module.PUBLISHED_AT in message


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _musique_row(**changes) -> str:
    row = json.loads((FIXTURES / "musique" / "musique_ans_v1.0_train.jsonl").read_text()
                     .splitlines()[0])
    row.update(changes)
    return json.dumps(row)


def _frames_rows(*rows: str) -> str:
    header = (FIXTURES / "frames" / "test.tsv").read_text().split("\n")[0]
    return "\n".join([header, *rows]) + "\n"


_LINKS = "\t" * 10  # eleven empty wikipedia_link_* cells
BAD_ROWS = {
    "musique invalid JSON": (musique, "ans", {
        "musique_ans_v1.0_train.jsonl": _musique_row() + "\n{not json\n",
        "musique_ans_v1.0_dev.jsonl": _musique_row() + "\n"},
        "musique_ans_v1.0_train.jsonl:2: invalid JSON"),
    "musique id without hops": (musique, "ans", {
        "musique_ans_v1.0_train.jsonl": _musique_row() + "\n",
        "musique_ans_v1.0_dev.jsonl": "\n" + _musique_row(id="q__1") + "\n"},
        "musique_ans_v1.0_dev.jsonl:2: id 'q__1' does not start with a hop count"),
    "musique aliases not a list": (musique, "ans", {
        "musique_ans_v1.0_train.jsonl": _musique_row(answer_aliases="x") + "\n",
        "musique_ans_v1.0_dev.jsonl": _musique_row() + "\n"},
        "musique_ans_v1.0_train.jsonl:1: field 'answer_aliases' must be a list of strings"),
    "frames short row": (frames, None, {
        "test.tsv": _frames_rows(f"0\tQ?\tOslo\t{_LINKS}\tNumerical reasoning\t[]",
                                 "1\tQ?\tOslo\tNumerical reasoning")},
        "test.tsv:3: expected 16 tab-separated fields"),
    "frames wiki_links not a literal": (frames, None, {
        "test.tsv": _frames_rows(f"0\tQ?\tOslo\t{_LINKS}\tTemporal reasoning\t"
                                 "__import__('os').getcwd()")},
        "test.tsv:2: column 'wiki_links' is not a Python list literal"),
    "webwalkerqa without a question": (webwalkerqa, None, {
        "main-00000-of-00001.jsonl": '{"question": "q", "answer": "Oslo"}\n{"answer": "Oslo"}\n'},
        "main-00000-of-00001.jsonl:2: missing field 'question'"),
    "gaia level": (gaia, "all", {
        "2023/validation/metadata.jsonl": '{"task_id": "t", "Question": "q", "Level": "two", '
                                          '"Final answer": "Oslo"}\n'},
        "metadata.jsonl:1: Level 'two' is not a number"),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_a_bad_row_names_file_and_line(tmp_path, case):
    module, config, files, expected = BAD_ROWS[case]
    for name, content in files.items():
        _write(tmp_path / "manual" / name, content)
    with pytest.raises(published.DatasetRowError) as error:
        module.prepare_dataset(config, manual_dir=tmp_path / "manual",
                               data_dir=tmp_path / "tfds")
    assert expected in str(error.value)
    assert str(error.value).startswith(str(tmp_path / "manual"))
