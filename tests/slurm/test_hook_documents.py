"""The Slurm hooks' documents read back into HookResult (``from_json(doc).to_json() == doc``) on real
runs against a simulated host: an epilog that ended the job's processes (its clear inside), a prolog
that drained the node (its diagnosis and drain inside); and the text a hook prints is what its
renderer prints from the document (what ``--host`` shows), timings aside."""

from __future__ import annotations

import json
import re

from gpuslate.cli.render.slurm import show_hook
from gpuslate.slurm.hooks import HookResult, HookStatus
from helpers import run_cli
from test_hooks import job_hold, slurm_env  # noqa: F401 - fixtures

_FLOAT = re.compile(r"\d+\.\d+")


def _hook(hook: str, env: dict[str, str], *extra: str, json_out: bool = True):
    return run_cli("slurm", hook, "--timeout", "2", *extra, *(["--json"] if json_out else []), env=env)


def test_hook_documents_read_back_and_render_the_same(sim_host, slurm_env, job_hold, capsys):  # noqa: F811
    job_hold("42", "--gpus", "1", "--memory", "2GiB", "--workers", "2")
    p = _hook("epilog", slurm_env)
    doc = json.loads(p.stdout)
    assert p.returncode == 0 and doc["clear"] is not None, p.stdout + p.stderr
    back = HookResult.from_json(doc)
    assert back.to_json() == doc and back.status is HookStatus.CLEAN and back.clear is not None

    job_hold("43", "--gpus", "1", "--memory", "1GiB")  # another job's: the prolog of 42 finds GPU 1 held
    texts = []
    for json_out in (True, False):
        p = _hook("prolog", slurm_env, json_out=json_out)
        assert p.returncode == 4, p.stdout + p.stderr
        if json_out:
            doc = json.loads(p.stdout)
            back = HookResult.from_json(doc)
            assert back.to_json() == doc and back.drain is not None and back.diagnosis
            show_hook(back)
            texts.append(capsys.readouterr().out)
        else:
            texts.append(p.stdout)
    assert "drained" in texts[1]
    assert _FLOAT.sub("F", texts[0]) == _FLOAT.sub("F", texts[1])
