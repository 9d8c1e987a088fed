"""One registry: every engine is one module of gpuslate/engines and one line of registry.py, and
nothing else names one. Whatever names engines reads the registry: a unit's engine and readiness,
``up --engine``, ``sim serve --emulate``, ``demo --engine``, the JSON Schema's engine enum, what
bench records and which counters it reads. The typed facts each engine declares (launch forms,
readiness, parking) are checked for the shapes the code relies on."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from gpuslate.engines import BACKENDS, SEED_ENGINE, detect, engine_files, read_command
from gpuslate.engines.base import Answers, Engine

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "gpuslate"
ENGINES_DIR = PACKAGE / "engines"


def _literals(path: Path) -> list[tuple[int, str]]:
    """Every string constant of a module but its docstrings."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_no_module_outside_the_engines_package_names_an_engine():
    """A branch on an engine, a choice list, a default: any of them is the engine's name as a string
    of its own (``== "vllm"``, ``("sglang", "vllm")``). The simulator's name is left out ("sim" names
    other things too); its own package is the simulator."""
    names = {n for n in BACKENDS if n != "sim"} | {e.reported for e in BACKENDS.values() if e.name != "sim"}
    found = [f"{p.relative_to(ROOT)}:{line}: {text!r}" for p in sorted(PACKAGE.rglob("*.py"))
             if ENGINES_DIR not in p.parents for line, text in _literals(p) if text in names]
    assert not found, "engine names outside gpuslate/engines (read the registry): " + "; ".join(found)


def test_the_checker_sees_a_name(tmp_path):
    (tmp_path / "m.py").write_text('"""Docs may say vllm."""\nif e == "vllm":\n    pass\n')
    assert _literals(tmp_path / "m.py") == [(2, "vllm")]


def test_one_module_and_one_line_each():
    modules = {p.stem for p in ENGINES_DIR.glob("*.py")} - {"__init__", "args", "base", "commands", "registry",
                                                            "standin"}
    assert modules == {type(e).__module__.rsplit(".", 1)[1] for e in BACKENDS.values()}
    registry = (ENGINES_DIR / "registry.py").read_text()
    assert all(registry.count(f"{m}.ENGINE") == 1 for m in modules)
    assert SEED_ENGINE in BACKENDS


def test_what_names_engines_reads_the_registry():
    from gpuslate.cli.commands.demo import EMULATED as DEMO
    from gpuslate.simserver.engineargs import EMULATED
    from gpuslate.units.spec import ENGINES

    assert tuple(BACKENDS) == ENGINES
    assert DEMO == EMULATED == tuple(n for n, e in BACKENDS.items() if n != "sim")
    schema = json.loads((ROOT / "docs/schemas/experiment.v1.json").read_text())
    apply = schema["properties"]["recommendation"]["properties"]["apply"]["properties"]
    assert set(apply["engine"]["enum"]) == {*BACKENDS, None}
    assert set(apply["status"]["enum"]) >= {"withdrawn"}
    from gpuslate.bench.report import ENGINE_FILES

    assert set(ENGINE_FILES) == set(engine_files()) and len(ENGINE_FILES) == len(set(ENGINE_FILES))


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_each_engine_declares_what_the_code_relies_on(name):
    e: Engine = BACKENDS[name]
    assert e.name == name and e.title and e.reported
    assert e.readiness.paths and all(p.startswith("/") for p in e.readiness.paths)
    assert all(p.startswith("/") for p in e.probes)
    # its launch forms are recognised as itself, and its own command's arguments start after them
    for prog, words in e.launch.programs:
        found, start = detect([prog, *words, "x"])
        assert found is e and start == 1 + len(words)
    for module, words in e.launch.modules:
        found, start = detect(["python3", "-m", module, *words, "x"])
        assert found is e and start == 3 + len(words)
    if e.park is not None:  # what park and resume are built on: a start flag, the calls, the levels
        p = e.park
        assert p.flag.startswith("--") and p.levels and p.tags and "weights" in p.tags
        assert p.missing([], {}) and not p.missing([p.flag], dict(p.env))
        for lv in p.levels:  # each level parks by POSTs and resumes by POSTs, the weights reloaded by the reload call
            assert lv.park and lv.resume and all(c.method == "POST" for c in (*lv.park, *lv.resume))
            assert lv.resume_reloads_weights == (p.reload_weights in lv.resume)
            assert not (lv.offloads and lv.resume_reloads_weights)
        # every call of a style has the one route the simulator plays for it
        assert len({lv.park[0].route for lv in p.levels}) == len({lv.resume[0].route for lv in p.levels}) == 1
        assert p.running.call.method == "GET" and (p.running.prometheus or p.running.keys)
        assert 0 < p.residue_fraction < 1 and p.residue_cap > 0
    ex = e.example(model="/m", draft="/d", port=1234, gpus=8, steps=3, folder="/f")
    if ex is not None:  # the demo's story in its form: read back as this engine, speculating with K = 3
        form = ["python3", *ex.form] if ex.form[0] == "-m" else list(ex.form)
        cmd = read_command([*form, *ex.speculative], read_file={f"/f/{n}": t for n, t in ex.files.items()}.get)
        assert cmd.engine == name and cmd.k == 3 and cmd.readable and not cmd.blockers, cmd
        assert read_command([*form, *ex.baseline], read_file=lambda p: "").missing


def test_server_identification_by_owned_by_and_documents():
    by = BACKENDS
    assert by["vllm"].identify(Answers({"/version": {"version": "0.25.0"}}, "vllm")) == {"engine": "vllm",
                                                                                        "version": "0.25.0"}
    # TensorRT-LLM answers /version as vLLM does: only its owned_by tells them apart
    assert by["vllm"].identify(Answers({"/version": {"version": "1.3.0"}}, "tensorrt_llm")) is None
    assert by["trtllm"].identify(Answers({"/version": {"version": "1.3.0"}}, "tensorrt_llm"))["engine"] == "trtllm"
    # a recent trtllm-serve has a /server_info too: not SGLang's
    assert by["sglang"].identify(Answers({"/server_info": {"version": "x"}}, "tensorrt_llm")) is None
    sim = by["sim"].identify(Answers({"/get_server_info": {"simulated": True, "emulates": "trtllm",
                                                           "engine_version": "1.3.0", "mode": "speculative"}},
                                     "tensorrt_llm"))
    assert sim == {"engine": "trtllm", "version": "1.3.0", "info_path": "/get_server_info", "simulated": True,
                   "mode": "speculative"}
