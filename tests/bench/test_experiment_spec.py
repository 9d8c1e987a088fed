"""The experiment spec: units parsed exactly as gpuslate.toml's, references to the project's
gpuslate.toml, roles, the load plan; every mistake is exit 2 with FILE:LINE, nothing started."""

from __future__ import annotations

import pytest

from gpuslate.bench.spec import line_of, load_spec
from gpuslate.errors import UsageError

GOOD = """\
[experiment]
name = "t"
deployments = ["baseline", "speculative"]

[load]
concurrency = [1, 2, 4]
requests = 8
repeats = 2
output_len = 16

[units.baseline]
command = "python -m gpuslate sim serve --port 31000"
port = 31000
engine = "sglang"

[units.speculative]
command = ["python", "-m", "gpuslate", "sim", "serve", "--port", "31000", "--mode", "speculative"]
port = 31000
engine = "sglang"
"""


def write(tmp_path, text: str, name: str = "exp.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_good_spec(tmp_path):
    spec = load_spec(write(tmp_path, GOOD))
    assert [d.name for d in spec.deployments] == ["baseline", "speculative"]
    assert [d.role for d in spec.deployments] == ["baseline", "speculative"]  # named after their roles
    assert spec.levels == (1, 2, 4) and spec.repeats == 2
    assert spec.load == {"requests": 8, "output_len": 16}
    assert spec.deployments[0].unit.command[:3] == ["python", "-m", "gpuslate"]
    assert spec.deployments[1].unit.engine == "sglang"


def test_deployments_run_as_units_of_the_experiments_own_namespace(tmp_path):
    """As compose names a project's containers after the project: the experiment's baseline is the
    unit t.baseline, never the user's baseline (also when the unit comes from their gpuslate.toml)."""
    spec = load_spec(write(tmp_path, GOOD))
    assert [d.unit.name for d in spec.deployments] == ["t.baseline", "t.speculative"]
    assert [d.name for d in spec.deployments] == ["baseline", "speculative"]  # the report's names stay
    plus = load_spec(write(tmp_path, GOOD.replace('name = "t"', 'name = "a+b"')))
    assert plus.deployments[0].unit.name == "a-b.baseline"  # '+' is no unit-name character
    long = GOOD.replace('name = "t"', f'name = "{"x" * 60}"')
    with pytest.raises(UsageError, match=r"exp\.toml:2: deployment 'baseline' runs as unit 'x{60}\.baseline', "
                       r"longer than a unit name may be \(64 characters\)"):
        load_spec(write(tmp_path, long))


def test_reference_to_project_gpuslate_toml(tmp_path):
    (tmp_path / "gpuslate.toml").write_text(
        '[units.eagle]\ncommand = "serve --port 1"\nport = 1\n\n[units.plain]\ncommand = "serve"\nport = 1\n')
    sub = tmp_path / "exp"
    sub.mkdir()
    spec = load_spec(write(sub, '[experiment]\nconfig = "../gpuslate.toml"\ndeployments = ["plain", "eagle"]\n'
                                '[roles]\nbaseline = "plain"\nspeculative = "eagle"\n'))
    assert [(d.name, d.role) for d in spec.deployments] == [("plain", "baseline"), ("eagle", "speculative")]
    assert spec.deployments[0].source.endswith("gpuslate.toml")
    assert [d.unit.name for d in spec.deployments] == ["exp.plain", "exp.eagle"]  # the file's stem


@pytest.mark.parametrize("edit, line, words", [
    (("requests = 8", "requests = 0"), 7, "requests must be >= 1"),
    (("requests = 8", 'requests = "8"'), 7, "wrong type"),
    (("repeats = 2", "repeats = 2\nrepeat = 3"), 9, "unknown key 'repeat'"),
    (("concurrency = [1, 2, 4]", "concurrency = [1, 0]"), 6, "concurrency must be"),
    (('engine = "sglang"\n\n[units.spec', 'engine = "sglang"\nbogus = 1\n\n[units.spec'), 15, "unknown key 'bogus'"),
    (('deployments = ["baseline", "speculative"]', 'deployments = ["baseline", "nope"]'), 3, "'nope' is not defined"),
    (('name = "t"', 'name = "t"\nclear = "yes"'), 3, "wrong type"),
    (("[load]", "[lode]"), 5, "unknown table"),
    (("output_len = 16", "output_len = 2000000"), 5, "[load]: output length must be"),  # LoadPlan's own check
    (('port = 31000\nengine = "sglang"\n\n[units.spec', 'engine = "sglang"\n\n[units.spec'), 11,
     "needs a port"),
])
def test_malformed_spec_names_file_and_line(tmp_path, edit, line, words):
    old, new = edit
    assert old in GOOD
    p = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(UsageError) as exc:
        load_spec(p)
    msg = str(exc.value)
    assert msg.startswith(f"{p}:{line}:"), msg
    assert words in msg


def test_toml_syntax_error_has_line(tmp_path):
    p = write(tmp_path, GOOD.replace("requests = 8", "requests = = 8"))
    with pytest.raises(UsageError, match=r"line 7"):
        load_spec(p)


def test_roles_checked(tmp_path):
    p = write(tmp_path, GOOD + '\n[roles]\nbaseline = "speculative"\nspeculative = "speculative"\n')
    with pytest.raises(UsageError, match="two roles"):
        load_spec(p)
    p = write(tmp_path, GOOD + '\n[roles]\ndraft = "speculative"\n')
    with pytest.raises(UsageError, match=r":22: unknown role 'draft'"):
        load_spec(p)


def test_line_of():
    text = "[a]\nx = 1\n[b]\nx = 2\n  y.z = 3\n[units.'q']\nk=1\n"
    assert line_of(text, "b", "x") == 4 and line_of(text, "b", "y") == 5 and line_of(text, "a", "x") == 2
    assert line_of(text, "units.q", None) == 6 and line_of(text, "units.q", "k") == 7
    assert line_of(text, None, "b") == 3


def test_cli_malformed_spec_exit_2(tmp_path, cli):
    p = write(tmp_path, GOOD.replace("requests = 8", "requests = -1"))
    r = cli("experiment", "run", str(p), "--out", str(tmp_path / "out"))
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"gpuslate: error: {p}:7:") and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # nothing started, nothing written
    r = cli("experiment", "run", str(tmp_path / "missing.toml"), "--json")
    assert r.returncode == 2 and '"gpuslate.error.v1"' in r.stdout


THREE = GOOD.replace('deployments = ["baseline", "speculative"]', 'deployments = ["baseline", "speculative", "t1"]')\
    .replace("repeats = 2", "repeats = 3") + """
[units.t1]
command = "python -m gpuslate sim serve --port 31000 --mode speculative --spec-disable-threshold 1"
port = 31000
"""


def test_interleaved_order_rotates_each_repeat(tmp_path):
    from gpuslate.bench.experiment import plan_for, schedule

    spec = load_spec(write(tmp_path, THREE))
    blocks = schedule(spec)
    # ABC, BCA, CAB: every deployment once per repeat, each in every position once
    assert [b.deployment.name for b in blocks] == ["baseline", "speculative", "t1", "speculative", "t1", "baseline",
                                                   "t1", "baseline", "speculative"]
    assert all({k.repeat for k in b.keys} == {i // 3} for i, b in enumerate(blocks))
    assert [k.concurrency for k in blocks[0].keys] == [1, 2, 4]
    assert plan_for(spec, blocks[3].keys[0]).seed == 1  # repeat 1's seed, whoever runs it


def test_blocked_order_ends_with_a_control_of_the_first_deployment(tmp_path):
    from gpuslate.bench.experiment import plan_for, schedule

    spec = load_spec(write(tmp_path, THREE.replace('name = "t"', 'name = "t"\norder = "blocked"\ncontrol_level = 2')))
    blocks = schedule(spec)
    assert [b.deployment.name for b in blocks] == ["baseline", "speculative", "t1", "baseline"]
    (ctl,) = blocks[-1].keys
    assert ctl.control and ctl.concurrency == 2 and ctl.filename.endswith("__control.json")
    assert plan_for(spec, ctl).seed == plan_for(spec, blocks[0].keys[0]).seed  # the same requests as repeat 0
    assert len(blocks[0].keys) == 3 * 3  # levels x repeats back to back


@pytest.mark.parametrize(("extra", "message"), [('order = "random"', "order must be one of"),
                                                ("control_level = 3", "control_level 3 is not one of the levels")])
def test_bad_order_or_control(tmp_path, extra, message):
    with pytest.raises(UsageError, match=message):
        load_spec(write(tmp_path, THREE.replace('name = "t"', f'name = "t"\n{extra}')))


def test_verify_needs_a_pair_and_a_bound(tmp_path):
    spec = load_spec(write(tmp_path, GOOD.replace('name = "t"\n', 'name = "t"\nverify = 2\n')))
    assert spec.verify == 2 and spec.to_json()["verify"] == 2
    with pytest.raises(UsageError, match=r"exp.toml:\d+: verify must be 0..10"):
        load_spec(write(tmp_path, GOOD.replace('name = "t"\n', 'name = "t"\nverify = 11\n')))
    lonely = GOOD.replace('deployments = ["baseline", "speculative"]', 'deployments = ["baseline"]')
    with pytest.raises(UsageError, match="verify needs a baseline and a speculative deployment"):
        load_spec(write(tmp_path, lonely.replace('name = "t"\n', 'name = "t"\nverify = 1\n')))
    # the verification's role is the run's, never one a spec gives
    with pytest.raises(UsageError, match="unknown role 'recommended'"):
        load_spec(write(tmp_path, GOOD + '\n[roles]\nrecommended = "speculative"\n'))


def test_resume_may_only_add_repeats_and_verify(tmp_path):
    from gpuslate.bench.spec import same_experiment

    before = load_spec(write(tmp_path, GOOD))
    ident, prev = before.identity(), before.to_json()
    more = load_spec(write(tmp_path, GOOD.replace("repeats = 2", "repeats = 3").replace(
        'name = "t"\n', 'name = "t"\nverify = 1\n'), "more.toml"))
    assert same_experiment(more, ident, prev) is None
    fewer = load_spec(write(tmp_path, GOOD.replace("repeats = 2", "repeats = 1"), "fewer.toml"))
    assert "fewer repeats (1) than the run had (2)" in (same_experiment(fewer, ident, prev) or "")
    other = load_spec(write(tmp_path, GOOD.replace("requests = 8", "requests = 9"), "other.toml"))
    assert same_experiment(other, ident, prev) == "other deployments or another load plan"
    # a folder made before repeats left the identity still resumes
    assert same_experiment(more, {**ident, "repeats": 2}, prev) is None
