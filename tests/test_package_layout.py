"""The package keeps the shape issue 12 set (measured by benchmarks/code_shape.py): at most seven
modules at the top level of matpo_jax/ (the entry points; the seventh, pretrain, builds the warm
start), no import cycles (imports inside functions count), and no library module importing run/ or
an entry point."""
import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _code_shape():
    spec = importlib.util.spec_from_file_location(
        "code_shape", os.path.join(REPO, "benchmarks", "code_shape.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_top_level_cycles_and_library_imports():
    shape = _code_shape().measure(REPO)
    assert len(shape["top_level_modules"]) <= 7, shape["top_level_modules"]
    assert shape["import_cycles"] == []
    assert shape["library_imports_of_run_level"] == []


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
