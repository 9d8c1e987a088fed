"""Every declared option of the verbs that only read (``status``, ``clear --dry-run``, ``wait``, ``ps``,
``audit``) run here and over ``--host`` prints the same, with the same exit code: the option read here
by the declaration's parser, written as the remote command line from the typed line, and read there
again (gpuslate/verbs.py). The options are taken from the declarations, one at a time, so an option
added to one of these verbs is run here as well; tests/test_verbs.py walks every option of every verb
through the command lines, and test_local_equals_remote*.py the commands that change the host.
"""

from __future__ import annotations

import getpass
from typing import Any

import pytest

from gpuslate import options, verbs
from gpuslate._parse import parse_size
from gpuslate._record import Form
from gpuslate.commandline import arguments
from test_local_equals_remote import Pair, _same, _stable

pytestmark = pytest.mark.ssh

#: the verbs that change nothing (clear as a dry run), with the words each needs
READING = {"status": [], "clear": ["--dry-run"], "wait": ["--free", "--timeout", "0"], "ps": [], "audit": []}


def _sample(parse: Any, held: int) -> str:
    """A value of each parser these verbs use, as a user types it (``held``: a process that holds GPUs)."""
    return {options.gpu_selection: "0,2-3", options.pid: str(held), options.text: getpass.getuser(),
            options.seconds: "5", parse_size: "1GiB", options.limit: "2"}[parse]


def _one_option_each(held: int) -> list[tuple[str, ...]]:
    runs = []
    for name, base in READING.items():
        for f in arguments(_verb(name).line):
            arg = f.arg
            if arg is None or arg.why_here is not None or arg.long in base:
                continue
            if arg.form is Form.FLAG:
                runs.append((name, *base, arg.long))
            elif arg.form is Form.OPTION:
                value = "sglang" if arg.long == "--match" else _sample(arg.parse, held)
                runs.append((name, *base, arg.long, value))
    return runs


def _verb(name: str) -> verbs.Verb[Any, Any]:
    return next(v for v in vars(verbs).values() if isinstance(v, verbs.Verb) and v.name == name)


@pytest.fixture
def pair(lab, fleet) -> Pair:
    return Pair(lab.hosts["h1"], fleet)


def test_every_option_of_the_reading_verbs_prints_the_same(pair, hold):
    held = hold("--memory", "3GiB", "--gpus", "0-1", "--workers", "2", "--title", "sglang::scheduler_TP{rank}",
                host=pair.host.sim)
    runs = _one_option_each(held.pid)
    assert ("clear", "--dry-run", "--include-handles") in runs and ("ps", "--all") in runs  # from the declarations
    assert len({r[0] for r in runs}) == len(READING)
    for args in runs:
        _same(pair.local(*args), pair.remote(*args), _stable)
