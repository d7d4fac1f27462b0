"""The package keeps the shape issue 12 set (measured by benchmarks/code_shape.py): at most eight
modules at the top level of matpo_jax/ (the entry points; pretrain builds the warm start and
convert_gguf brings a GGUF model in), no import cycles (imports inside functions count), and no library module importing run/ or
an entry point; trainer/ and agents/ import neither other (the trainer's input is TrainSequence);
and docs/ARCHITECTURE.md's layout block names exactly the modules there are."""
import ast
import importlib.util
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _code_shape():
    spec = importlib.util.spec_from_file_location(
        "code_shape", os.path.join(REPO, "benchmarks", "code_shape.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_top_level_cycles_and_library_imports():
    shape = _code_shape().measure(REPO)
    assert len(shape["top_level_modules"]) <= 8, shape["top_level_modules"]
    assert shape["import_cycles"] == []
    assert shape["library_imports_of_run_level"] == []


def test_the_trainer_sees_train_sequences_not_rollouts():
    # rl/batch.py turns rollouts into TrainSequences: trainer/ and agents/ import neither other.
    shape = _code_shape()
    mods = shape.modules(REPO)
    for package, other in (("trainer", "agents"), ("agents", "trainer")):
        imports = {f"{m} -> {d}" for m, path in mods.items() if m.startswith(f"matpo_jax.{package}")
                   for d in shape.imported(ast.parse(open(path).read()), m, set(mods),
                                           path.endswith("__init__.py"))
                   if d.startswith(f"matpo_jax.{other}")}
        assert not imports, sorted(imports)


def test_the_measure_sees_a_cycle_and_an_upward_import(tmp_path):
    # The checks above can fail: a package with both defects is reported.
    pkg = tmp_path / "matpo_jax"
    (pkg / "run").mkdir(parents=True)
    (pkg / "lib").mkdir()
    for init in (pkg, pkg / "run", pkg / "lib"):
        (init / "__init__.py").write_text("")
    (pkg / "lib" / "a.py").write_text("def f():\n    from matpo_jax.lib import b\n")
    (pkg / "lib" / "b.py").write_text("from matpo_jax.lib import a\nfrom matpo_jax.run import job\n")
    (pkg / "run" / "job.py").write_text("")
    shape = _code_shape().measure(str(tmp_path))
    assert shape["import_cycles"] == [["matpo_jax.lib.a", "matpo_jax.lib.b"]]
    assert shape["library_imports_of_run_level"] == ["matpo_jax.lib.b -> matpo_jax.run.job"]


def _layout_block() -> str:
    with open(os.path.join(REPO, "docs", "ARCHITECTURE.md")) as f:
        section = f.read().split("\n## Layout", 1)[1]
    return section.split("```", 2)[1]


def layout_modules(block: str) -> set[str]:
    """The modules a layout block names, as paths under matpo_jax/: a line `  pkg/  ...` opens a
    package (`    sub/` under it opens pkg/sub/), its deeper-indented lines continue it, and the
    `x.py` on them are its modules; an
    indented line that opens no package names top-level modules; unindented lines none."""
    named, package, parent = set(), None, None
    for line in block.splitlines():
        opened = re.match(r"^  (\w+)/", line)
        nested = re.match(r"^    (\w+)/", line)  # `    eval/` under `  run/`: run/eval/
        if opened:
            package = parent = opened.group(1) + "/"
        elif nested and parent:
            package = parent + nested.group(1) + "/"
        elif re.match(r"^  \S", line):
            package = ""
        elif not line.startswith("   "):
            package = None
        if package is not None:
            named |= {package + name + ".py" for name in re.findall(r"\b(\w+)\.py\b", line)}
    return named


def test_the_architecture_layout_names_every_module_and_only_those():
    root = os.path.join(REPO, "matpo_jax")
    actual = {os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root)
              for f in files if f.endswith(".py") and f != "__init__.py"}
    named = layout_modules(_layout_block())
    assert not actual - named, f"modules missing from the layout: {sorted(actual - named)}"
    assert not named - actual, f"the layout names modules that do not exist: {sorted(named - actual)}"


def test_the_layout_reader_sees_packages_continuations_and_top_level():
    # So the check above can fail: modules named per package, top level and continuations apart.
    block = ("matpo_jax/\n  a.py b.py\n               entry points\n"
             "  pkg/      c.py (a note),\n               d.py\nconfigs/ e.py\n")
    assert layout_modules(block) == {"a.py", "b.py", "pkg/c.py", "pkg/d.py"}
