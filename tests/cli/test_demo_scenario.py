"""The demo's experiment, in each engine's form (no server started): the seed's deployments as the
engine's own command lines, read back as that engine with its EAGLE-3 settings, and the stand-ins
that play the engine on gpuslate's simulated server (the whole demo runs in tests/bench/test_demo.py)."""

from __future__ import annotations

import os

import pytest

from gpuslate.bench.spec import load_spec
from gpuslate.cli.commands.demo import EMULATED, scenario
from gpuslate.engines import SEED_ENGINE, read_command


@pytest.mark.parametrize("engine", EMULATED)
def test_the_demo_tells_the_story_in_the_engines_form(engine, tmp_path):
    (tmp_path / "demo.toml").write_text(scenario(True, 41234, engine, tmp_path))
    spec = load_spec(tmp_path / "demo.toml")
    base, specd = spec.deployments
    assert (base.role, specd.role) == ("baseline", "speculative")
    assert base.unit.engine == specd.unit.engine == engine and base.unit.port == 41234
    files = {str(p): p.read_text() for p in tmp_path.iterdir() if p.is_file()}
    cmd = read_command(specd.unit.command, read_file=files.__getitem__)
    assert cmd.engine == engine and cmd.k == 3 and cmd.readable and not cmd.blockers, cmd
    assert cmd.method is not None and cmd.method.upper() == "EAGLE3" and cmd.draft == "/models/target-eagle3"
    assert read_command(base.unit.command, read_file=files.__getitem__).missing  # the baseline: no speculation
    # the stand-in the unit's environment finds first plays this engine on the simulated server
    env = specd.unit.env
    standins = [p for p in (tmp_path / "engines").rglob("*") if p.is_file() and p.name != "__init__.py"]
    assert (len(standins) == 1 and f"'--emulate', '{engine}'" in standins[0].read_text().replace('"', "'")) \
        or f"--emulate {engine} " in standins[0].read_text()
    first = env.get("PATH", env.get("PYTHONPATH", "")).split(os.pathsep)[0]
    assert standins[0].is_relative_to(first)


def test_the_seeds_engine_is_the_default():
    from gpuslate.cli.main import build_parser

    args = build_parser(["demo"]).parse_args(["demo"])
    assert args.engine == SEED_ENGINE and SEED_ENGINE in EMULATED
