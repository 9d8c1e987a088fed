"""``gpuslate completion bash|zsh|fish``: shell completion, generated from the parser itself.

The script is made from the argparse tree every command registers (commands, their
subcommands, options, the choices of an option, which values are files), so it cannot drift
from the program: a new option completes once it exists. No dependency: argcomplete and shtab
would do it too, but argcomplete runs Python at every Tab (a ``gpuslate`` start each time) and
either is a package more for what a small generator does; the scripts are static, so a Tab
costs the shell nothing. Hidden commands (``log``) and options whose help is suppressed are
left out.

A unit's NAME (``down``, ``logs``, ``swap``...: every positional a verb's declaration reads as a unit
name) completes to the units there are, as compose completes services: the ``[units.NAME]`` tables
of the unit file (``$GPUSLATE_CONFIG``, else ``gpuslate.toml`` here or in a folder above, as
gpuslate finds it) and the units with a record in the state folder (``$GPUSLATE_STATE_DIR``, else
``$GPUSLATE_SIM/state``, else the XDG state folder: those ``ps -a`` lists). Read by the shell itself
(a ``sed`` of the file's table headers, a glob of the records), not by running gpuslate: a Tab
stays a few milliseconds.

    eval "$(gpuslate completion bash)"     # ~/.bashrc
    eval "$(gpuslate completion zsh)"      # ~/.zshrc (after compinit)
    gpuslate completion fish > ~/.config/fish/completions/gpuslate.fish
"""

from __future__ import annotations

import argparse
import sys
from typing import NamedTuple

from ...options import unit_name
from ..exits import ExitStatus, exit_epilog
from .common import describe

SHELLS = ("bash", "zsh", "fish")
#: metavars whose values are paths: completed as files
_FILE_METAVARS = {"DIR", "FILE", "PATH", "SPEC.toml", "SPEC", "SIMDIR"}


class Option(NamedTuple):
    names: tuple[str, ...]
    help: str
    takes_value: bool
    choices: tuple[str, ...]
    files: bool


class Command(NamedTuple):
    """One parser of the tree: its path of words (``("sim", "init")``), its visible subcommands
    (name, help), its options, and whether its positional arguments are paths."""

    path: tuple[str, ...]
    subcommands: tuple[tuple[str, str], ...]
    options: tuple[Option, ...]
    files: bool
    choices: tuple[str, ...] = ()  # of a positional argument (completion SHELL)
    units: bool = False  # its positional arguments are unit names


def build(p: argparse.ArgumentParser) -> None:
    """Its options (the parser is made from its row of the command table, with its summary)."""
    describe(p, examples=[("bash: this line in ~/.bashrc is eval \"$(gpuslate completion bash)\"",
                          "gpuslate completion bash"),
                         ("fish: written once where fish looks", "gpuslate completion fish")],
             description="Print the completion script of SHELL, generated from gpuslate's own options. "
                       "bash: eval \"$(gpuslate completion bash)\" in ~/.bashrc; zsh: eval \"$(gpuslate completion "
                       "zsh)\" in ~/.zshrc after compinit; fish: gpuslate completion fish > "
                       "~/.config/fish/completions/gpuslate.fish.",
                       epilog=exit_epilog(backend=False))
    p.add_argument("shell", metavar="SHELL", choices=SHELLS, help="bash, zsh or fish")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..main import build_parser  # lazy: startup (the whole tree: every command's module)

    tree = commands(build_parser())
    sys.stdout.write({"bash": bash, "zsh": zsh, "fish": fish}[args.shell](tree))
    return ExitStatus.OK


def _text(help_text: str | None) -> str:
    return " ".join((help_text or "").replace("%%", "%").split())


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[Command]:
    """Every parser of the tree, depth first (lazily built options built first)."""
    build = getattr(parser, "lazy_build", None)
    if build is not None:
        parser.lazy_build = None  # type: ignore[attr-defined]
        build(parser)
    subs: list[tuple[str, str]] = []
    children: list[tuple[str, argparse.ArgumentParser]] = []
    options: list[Option] = []
    files = units = False
    values: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            shown = {a.dest: _text(a.help) for a in action._choices_actions}  # hidden ones have no entry
            for name, child in action.choices.items():
                if name in shown:
                    subs.append((name, shown[name]))
                    children.append((name, child))
        elif action.option_strings:
            if action.help == argparse.SUPPRESS:
                continue
            takes = action.nargs != 0
            options.append(Option(tuple(action.option_strings), _text(action.help), takes,
                                  tuple(str(c) for c in action.choices or ()) if takes else (),
                                  takes and str(action.metavar) in _FILE_METAVARS))
        elif getattr(action.type, "__wrapped__", None) is unit_name:  # a verb's NAME, by its declaration
            units = True
        elif action.choices:
            values += [str(c) for c in action.choices]
        elif str(action.metavar) in _FILE_METAVARS:
            files = True
    out = [Command(path, tuple(subs), tuple(options), files, tuple(values), units)]
    for name, child in children:
        out += commands(child, (*path, name))
    return out


#: the names of a unit file's tables: ``[units.web]``, ``[units."a.b"]`` (a POSIX sed script)
_TABLES_SED = r's/^[[:space:]]*\[[[:space:]]*units\.\("\{0,1\}\)\([A-Za-z0-9_.-]*\)\1[[:space:]]*\].*/\2/p'


def _key(path: tuple[str, ...]) -> str:
    """A command's key in the scripts: its words after ``gpuslate`` (``gpuslate sim init``)."""
    return " ".join(("gpuslate", *path))


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def bash(tree: list[Command]) -> str:
    """A ``complete -F _gpuslate gpuslate`` function: the command path from the words typed so far
    (options and their values skipped), then its subcommands and options, an option's choices or
    files, or files for a path argument."""
    words, valued, choices, files, pos_files, unit_pos = [], [], [], [], [], []
    for c in tree:
        key = _key(c.path)
        opts = [n for o in c.options for n in o.names]
        words.append(f"    [{_quote(key)}]={_quote(' '.join([n for n, _ in c.subcommands] + list(c.choices) + opts))}")
        valued += [f"    [{_quote(key + ' ' + n)}]=1" for o in c.options if o.takes_value for n in o.names]
        choices += [f"    [{_quote(key + ' ' + n)}]={_quote(' '.join(o.choices))}"
                    for o in c.options if o.choices for n in o.names]
        files += [f"    [{_quote(key + ' ' + n)}]=1" for o in c.options if o.files for n in o.names]
        if c.files:
            pos_files.append(f"    [{_quote(key)}]=1")
        if c.units:
            unit_pos.append(f"    [{_quote(key)}]=1")
    subs = [f"    [{_quote(_key(c.path))}]={_quote(' '.join(n for n, _ in c.subcommands))}" for c in tree]
    return f"""# bash completion for gpuslate (generated by 'gpuslate completion bash'; needs bash 4)
declare -gA _gpuslate_words=(
{chr(10).join(words)}
)
declare -gA _gpuslate_subs=(
{chr(10).join(subs)}
)
declare -gA _gpuslate_valued=(
{chr(10).join(valued)}
)
declare -gA _gpuslate_choices=(
{chr(10).join(choices)}
)
declare -gA _gpuslate_files=(
{chr(10).join(files)}
)
declare -gA _gpuslate_posfiles=(
{chr(10).join(pos_files)}
)
declare -gA _gpuslate_unitpos=(
{chr(10).join(unit_pos)}
)

_gpuslate_units() {{  # unit names: the unit file's [units.NAME] tables, the state folder's records
    local dir=$PWD file=$GPUSLATE_CONFIG state f
    while [[ -z $file && -n $dir ]]; do
        [[ -f $dir/gpuslate.toml ]] && file=$dir/gpuslate.toml
        dir=${{dir%/*}}
    done
    [[ -n $file && -r $file ]] && sed -n {_quote(_TABLES_SED)} "$file" 2>/dev/null
    if [[ -n $GPUSLATE_STATE_DIR ]]; then state=$GPUSLATE_STATE_DIR
    elif [[ -n $GPUSLATE_SIM ]]; then state=$GPUSLATE_SIM/state
    else state=${{XDG_STATE_HOME:-$HOME/.local/state}}/gpuslate
    fi
    for f in "$state"/units/*.json; do
        [[ -f $f ]] && f=${{f##*/}} && echo "${{f%.json}}"
    done
}}

_gpuslate() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}} path=gpuslate word i
    COMPREPLY=()
    for (( i = 1; i < COMP_CWORD; i++ )); do
        word=${{COMP_WORDS[i]}}
        if [[ $word == -- ]]; then
            return 0  # a unit's own command line follows
        elif [[ $word == -* ]]; then
            [[ -n ${{_gpuslate_valued["$path $word"]}} || -n ${{_gpuslate_valued["gpuslate $word"]}} ]] && (( i++ ))
        elif [[ " ${{_gpuslate_subs[$path]}} " == *" $word "* ]]; then
            path="$path $word"
        fi
    done
    if [[ $prev == -* && ( -n ${{_gpuslate_valued["$path $prev"]}} || -n ${{_gpuslate_valued["gpuslate $prev"]}} ) ]]
    then
        if [[ -n ${{_gpuslate_choices["$path $prev"]}} ]]; then
            COMPREPLY=( $(compgen -W "${{_gpuslate_choices["$path $prev"]}}" -- "$cur") )
        elif [[ -n ${{_gpuslate_files["$path $prev"]}} || -n ${{_gpuslate_files["gpuslate $prev"]}} ]]; then
            COMPREPLY=( $(compgen -f -- "$cur") )
        fi
        return 0
    fi
    if [[ $cur != -* && -n ${{_gpuslate_posfiles[$path]}} ]]; then
        COMPREPLY=( $(compgen -f -- "$cur") )
        return 0
    fi
    local names=
    [[ $cur != -* && -n ${{_gpuslate_unitpos[$path]}} ]] && names=$(_gpuslate_units)
    COMPREPLY=( $(compgen -W "${{_gpuslate_words[$path]}} $names" -- "$cur") )
}}
complete -o default -F _gpuslate gpuslate
"""


def _zsh_item(name: str, help_text: str) -> str:
    return _quote(name.replace(":", "\\:") + (":" + help_text if help_text else ""))


def zsh(tree: list[Command]) -> str:
    """A ``compdef`` function on the same walk as bash's, with the help of every subcommand and
    option shown beside it (``_describe``)."""
    cases = []
    for c in tree:
        items = [_zsh_item(n, h) for n, h in c.subcommands] + [_zsh_item(n, "") for n in c.choices]
        items += [_zsh_item(n, o.help) for o in c.options for n in o.names]
        values = [f"        ({_quote(_key(c.path) + ' ' + n)}) "
                  + (f"compadd -- {' '.join(_quote(x) for x in o.choices)}" if o.choices else
                     "_files" if o.files else ":") + " ;;"
                  for o in c.options if o.takes_value for n in o.names]
        cases.append(f"    ({_quote(_key(c.path))})\n"
                     f"      subs=({' '.join(_quote(n) for n, _ in c.subcommands)})\n"
                     f"      items=({' '.join(items)})\n"
                     f"      valued=({' '.join(_quote(n) for o in c.options if o.takes_value for n in o.names)})\n"
                     f"      posfiles={1 if c.files else 0} unitpos={1 if c.units else 0} ;;")
        if values:
            cases.append("\n".join(values))
    return f"""#compdef gpuslate
# zsh completion for gpuslate (generated by 'gpuslate completion zsh')

_gpuslate_units() {{  # unit names: the unit file's [units.NAME] tables, the state folder's records
  setopt localoptions nullglob
  local dir=$PWD file=$GPUSLATE_CONFIG state f
  while [[ -z $file && -n $dir ]]; do
    [[ -f $dir/gpuslate.toml ]] && file=$dir/gpuslate.toml
    dir=${{dir%/*}}
  done
  [[ -n $file && -r $file ]] && sed -n {_quote(_TABLES_SED)} "$file" 2>/dev/null
  if [[ -n $GPUSLATE_STATE_DIR ]]; then state=$GPUSLATE_STATE_DIR
  elif [[ -n $GPUSLATE_SIM ]]; then state=$GPUSLATE_SIM/state
  else state=${{XDG_STATE_HOME:-$HOME/.local/state}}/gpuslate
  fi
  for f in $state/units/*.json; do
    f=${{f:t}}; print -r -- ${{f%.json}}
  done
}}

_gpuslate_spec() {{  # the command at path $1: its subcommands, items, valued options
  subs=() items=() valued=() posfiles=0 unitpos=0
  case $1 in
{chr(10).join(c for c in cases if c.startswith("    ("))}
  esac
}}

_gpuslate_value() {{  # complete the value of option $2 of the command at path $1
  case "$1 $2" in
{chr(10).join(c for c in cases if c.startswith("        ("))}
    (*) return 1 ;;
  esac
}}

_gpuslate() {{
  # not 'path': zsh ties it to PATH
  local at=gpuslate word i subs items valued posfiles unitpos
  for (( i = 2; i < CURRENT; i++ )); do
    word=${{words[i]}}
    _gpuslate_spec "$at"
    if [[ $word == -- ]]; then
      _normal; return  # a unit's own command line follows
    elif [[ $word == -* ]]; then
      (( ${{valued[(Ie)$word]}} )) && (( i++ ))
    elif (( ${{subs[(Ie)$word]}} )); then
      at="$at $word"
    fi
  done
  _gpuslate_spec "$at"
  local prev=${{words[CURRENT-1]}}
  if [[ $prev == -* ]] && (( ${{valued[(Ie)$prev]}} )); then
    _gpuslate_value "$at" "$prev"
    return
  fi
  if [[ ${{words[CURRENT]}} != -* ]] && (( posfiles )); then
    _files
    return
  fi
  if [[ ${{words[CURRENT]}} != -* ]] && (( unitpos )); then
    local -a names; names=(${{(f)"$(_gpuslate_units)"}})
    (( $#names )) && compadd -- $names
  fi
  _describe -t commands gpuslate items
}}

if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
  _gpuslate "$@"
else
  compdef _gpuslate gpuslate
fi
"""


def fish(tree: list[Command]) -> str:
    """``complete -c gpuslate`` lines, each guarded by the command path typed so far."""
    lines = ["# fish completion for gpuslate (generated by 'gpuslate completion fish')",
             "function __gpuslate_path",
             "    set -l words (commandline -opc)",
             "    set -e words[1]",
             "    set -l path gpuslate",
             "    set -l skip 0",
             "    for w in $words",
             "        if test $skip = 1; set skip 0; continue; end",
             "        if test \"$w\" = --; echo --; return; end",
             "        if string match -q -- '-*' $w",
             "            if contains -- \"$path $w\" $__gpuslate_valued; set skip 1; end",
             "            continue",
             "        end",
             "        if contains -- \"$path $w\" $__gpuslate_subs",
             "            set path \"$path $w\"",
             "        end",
             "    end",
             "    echo $path",
             "end",
             "function __gpuslate_at",
             "    test (__gpuslate_path) = (string join ' ' gpuslate $argv)",
             "end",
             "function __gpuslate_units  # the unit file's [units.NAME] tables, the state folder's records",
             "    set -l file $GPUSLATE_CONFIG",
             "    set -l dir $PWD",
             "    while test -z \"$file\" -a -n \"$dir\"",
             "        test -f $dir/gpuslate.toml; and set file $dir/gpuslate.toml",
             "        set dir (string replace -r '/[^/]*$' '' -- $dir)",
             "    end",
             "    test -n \"$file\" -a -r \"$file\"; and sed -n " + _quote(_TABLES_SED) + " $file 2>/dev/null",
             "    set -l state $HOME/.local/state/gpuslate",
             "    set -q XDG_STATE_HOME; and set state $XDG_STATE_HOME/gpuslate",
             "    set -q GPUSLATE_SIM; and set state $GPUSLATE_SIM/state",
             "    set -q GPUSLATE_STATE_DIR; and set state $GPUSLATE_STATE_DIR",
             "    for f in $state/units/*.json",
             "        string replace -r '^.*/(.*)\\.json$' '$1' -- $f",
             "    end",
             "end"]
    # "PATH WORD", as __gpuslate_path joins them
    valued = [f"{_key(c.path)} {n}" for c in tree for o in c.options if o.takes_value for n in o.names]
    subs = [f"{_key(c.path)} {n}" for c in tree for n, _ in c.subcommands]
    lines.append("set -g __gpuslate_valued " + " ".join(_quote(v) for v in valued))
    lines.append("set -g __gpuslate_subs " + " ".join(_quote(s) for s in subs))
    lines.append("complete -c gpuslate -f")
    for c in tree:
        cond = "-n " + _quote(" ".join(("__gpuslate_at", *c.path)))
        for name, help_text in c.subcommands:
            lines.append(f"complete -c gpuslate {cond} -a {_quote(name)} -d {_quote(help_text)}")
        for o in c.options:
            flags = " ".join(f"-l {n[2:]}" if n.startswith("--") else f"-s {n[1:]}" for n in o.names)
            extra = (f" -x -a {_quote(' '.join(o.choices))}" if o.choices else " -r -F" if o.files else
                     " -x" if o.takes_value else "")
            lines.append(f"complete -c gpuslate {cond} {flags}{extra} -d {_quote(o.help)}")
        if c.choices:
            lines.append(f"complete -c gpuslate {cond} -a {_quote(' '.join(c.choices))}")
        if c.files:
            lines.append(f"complete -c gpuslate {cond} -F")
        if c.units:
            lines.append(f"complete -c gpuslate {cond} -a '(__gpuslate_units)' -d unit")
    return "\n".join(lines) + "\n"
