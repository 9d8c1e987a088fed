"""Shell completion generated from the parser: the bash script sourced in a real bash (complete -p,
the function run on typed words), the zsh one run by a real zsh (its completion builtins stubbed),
the fish one asked by a real fish (complete -C)."""

from __future__ import annotations

import shutil
import subprocess

from gpuslate.cli.commands.completion import commands
from gpuslate.cli.main import COMMANDS, build_parser
from helpers import gpuslate_env, run_cli, unavailable

CASES = [  # words typed (the last one being completed) -> what must be offered
    (["gpuslate", "st"], ["status"]),
    (["gpuslate", "clear", "--dr"], ["--dry-run"]),
    (["gpuslate", "sim", ""], ["init", "hold", "serve", "leak"]),
    (["gpuslate", "sim", "init", "--memory-api", ""], ["v1", "v2"]),
    (["gpuslate", "--sim", "/tmp", "sim", "i"], ["init"]),
    (["gpuslate", "up", "web", "--engine", ""], ["sglang", "vllm"]),
    (["gpuslate", "completion", ""], ["bash", "fish", "zsh"]),
    (["gpuslate", "experiment", "r"], ["report", "run"]),
]


def script(shell: str) -> str:
    r = run_cli("completion", shell)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return r.stdout


def need(program: str) -> str:
    found = shutil.which(program)
    if not found:
        unavailable(f"{program} is not installed")
    return str(found)


def test_generated_from_the_parser_every_command_and_option() -> None:
    tree = {c.path: c for c in commands(build_parser())}
    top = {name for name, _ in tree[()].subcommands}
    assert top == set(COMMANDS) - {"log"}  # the old name stays hidden
    clear = {n for o in tree[("clear",)].options for n in o.names}
    assert {"--gpus", "--pid", "--match", "--dry-run", "--yes", "--sim", "--json"} <= clear
    assert {("sim", "serve"), ("slurm", "epilog"), ("experiment", "report")} <= set(tree)
    assert "--time-scale" in {n for o in tree[("sim", "serve")].options for n in o.names}  # built lazily


def test_bash(tmp_path) -> None:
    bash = need("bash")
    (tmp_path / "gpuslate.bash").write_text(script("bash"))
    (tmp_path / "spec.toml").write_text("")
    calls = "\n".join(
        "COMP_WORDS=(" + " ".join(f"'{w}'" for w in words) + f"); COMP_CWORD={len(words) - 1}; _gpuslate; "
        "echo \"${COMPREPLY[*]}\"" for words, _ in CASES)
    r = subprocess.run([bash, "--norc", "-c", f"source gpuslate.bash\ncomplete -p gpuslate\n{calls}\n"
                        "COMP_WORDS=(gpuslate experiment run sp); COMP_CWORD=3; _gpuslate; echo \"${COMPREPLY[*]}\"\n"
                        "COMP_WORDS=(gpuslate up web -- pyth); COMP_CWORD=4; _gpuslate; echo \"[${COMPREPLY[*]}]\""],
                       capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "complete -o default -F _gpuslate gpuslate"
    for (words, offered), line in zip(CASES, lines[1:]):
        assert sorted(line.split()) == sorted(offered) or set(offered) <= set(line.split()), (words, line)
    assert lines[-2] == "spec.toml"  # a path argument: files
    assert lines[-1] == "[]"  # a unit's own command line after --: the shell's default completion


def test_zsh(tmp_path) -> None:
    zsh = need("zsh")
    (tmp_path / "_gpuslate").write_text(script("zsh"))
    stubs = """
compdef() { print "compdef $*" }
_describe() { local -a got; got=(${(P)${@[-1]}}); print -r -- ${(M)${got%%:*}:#${words[CURRENT]}*} }
compadd() { shift; print -r -- "$*" }
_files() { print files }
_normal() { print normal }
"""
    calls = "\n".join("words=(" + " ".join(f"'{w}'" for w in words) + f"); CURRENT={len(words)}; _gpuslate"
                      for words, _ in CASES)
    r = subprocess.run([zsh, "-f", "-c", f"{stubs}\nsource ./_gpuslate\n{calls}\n"
                        "words=(gpuslate experiment run sp); CURRENT=4; _gpuslate"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "compdef _gpuslate gpuslate"
    for (words, offered), line in zip(CASES, lines[1:]):
        assert set(offered) <= set(line.split()), (words, line)
    assert lines[-1] == "files"


def test_fish(tmp_path) -> None:
    fish = need("fish")
    (tmp_path / "gpuslate.fish").write_text(script("fish"))
    calls = "; ".join(f"complete -C '{' '.join(words)}'; echo ---" for words, _ in CASES)
    r = subprocess.run([fish, "--no-config", "-c", f"source gpuslate.fish; {calls}"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    blocks = r.stdout.split("---\n")
    for (words, offered), block in zip(CASES, blocks):
        got = {line.split("\t")[0] for line in block.splitlines()}
        assert set(offered) <= got, (words, block)
    assert "show every GPU and every process that holds it" in blocks[0]  # the help beside it


def test_an_unknown_shell_is_bad_input() -> None:
    r = run_cli("completion", "tcsh")
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1


# -- unit names: the unit file's tables and the state folder's records, read by the shell itself --

UNIT_CASES = [  # words typed -> unit names that must be offered (None: none at all)
    (["gpuslate", "down", ""], ["web", "a.b", "old"]),
    (["gpuslate", "logs", "w"], ["web"]),
    (["gpuslate", "swap", "web", ""], ["web", "a.b", "old"]),
    (["gpuslate", "--sim", "/x", "restart", "o"], ["old"]),
    (["gpuslate", "status", ""], None),
]


def unit_world(tmp_path):
    """A project with a unit file (two units, one quoted) one folder up, and a state folder with the
    record of a unit the file no longer has; the shell runs in the project's subfolder."""
    (tmp_path / "gpuslate.toml").write_text('[units.web]\ncommand = "x"\n\n  [ units."a.b" ]\ncommand = "y"\n'
                                            '[unitsx.no]\n# [units.commented]\n')
    (tmp_path / "state" / "units").mkdir(parents=True)
    (tmp_path / "state" / "units" / "old.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    env = {k: v for k, v in gpuslate_env().items() if k not in ("GPUSLATE_CONFIG", "GPUSLATE_SIM")}
    return tmp_path / "sub", {**env, "GPUSLATE_STATE_DIR": str(tmp_path / "state")}


def check_units(got: list[set[str]]) -> None:
    for (words, names), offered in zip(UNIT_CASES, got, strict=True):
        if names is None:
            assert not offered & {"web", "a.b", "old", "commented", "no"}, (words, offered)
        else:
            assert set(names) <= offered and not offered & {"commented", "no"}, (words, offered)


def test_bash_completes_unit_names(tmp_path) -> None:
    bash = need("bash")
    cwd, env = unit_world(tmp_path)
    (tmp_path / "gpuslate.bash").write_text(script("bash"))
    calls = "\n".join("COMP_WORDS=(" + " ".join(f"'{w}'" for w in words) + f"); COMP_CWORD={len(words) - 1}; "
                      "_gpuslate; echo \"${COMPREPLY[*]}\"" for words, _ in UNIT_CASES)
    r = subprocess.run([bash, "--norc", "-c", f"source ../gpuslate.bash\n{calls}\n"], capture_output=True, text=True,
                       cwd=cwd, env=env, timeout=30)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    check_units([set(line.split()) for line in r.stdout.splitlines()])


def test_zsh_completes_unit_names(tmp_path) -> None:
    zsh = need("zsh")
    cwd, env = unit_world(tmp_path)
    (tmp_path / "_gpuslate").write_text(script("zsh"))
    stubs = """
compdef() { : }
_describe() { local -a got; got=(${(P)${@[-1]}}); print -r -- ${(M)${got%%:*}:#${words[CURRENT]}*} }
compadd() { shift; print -r -- "${(M)@:#${words[CURRENT]}*}" }
_files() { print files }
"""
    calls = "\n".join("words=(" + " ".join(f"'{w}'" for w in words) + f"); CURRENT={len(words)}; "
                      "print -r -- \"$(_gpuslate)\" | tr '\\n' ' '; print" for words, _ in UNIT_CASES)
    r = subprocess.run([zsh, "-f", "-c", f"{stubs}\nsource ../_gpuslate\n{calls}"], capture_output=True, text=True,
                       cwd=cwd, env=env, timeout=30)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    check_units([set(line.split()) for line in r.stdout.splitlines()])


def test_fish_completes_unit_names(tmp_path) -> None:
    fish = need("fish")
    cwd, env = unit_world(tmp_path)
    (tmp_path / "gpuslate.fish").write_text(script("fish"))
    calls = "; ".join(f"complete -C '{' '.join(words)}'; echo ---" for words, _ in UNIT_CASES)
    r = subprocess.run([fish, "--no-config", "-c", f"source ../gpuslate.fish; {calls}"], capture_output=True,
                       text=True, cwd=cwd, env=env, timeout=30)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    blocks = r.stdout.split("---\n")[:len(UNIT_CASES)]
    check_units([{line.split("\t")[0] for line in block.splitlines()} for block in blocks])
