"""``gpuslate up NAME [options] -- COMMAND ARGS...``: start a managed server, return once it serves;
``gpuslate up [NAME...]``: several units of the unit file, or all of them (as ``docker compose up``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ...engines.registry import BACKENDS
from ...errors import UsageError
from ..exits import exit_epilog
from ..render.live import LiveLine
from . import present
from .common import add_common, gpus_arg, nonnegative_float, port_type, positive_float, size

UP_EXITS = {0: "ready", 4: "not ready within --start-timeout, or its GPUs or port busy at pre-flight",
            5: "permission denied", 6: "the server failed (exited before ready, failed its smoke test)"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="start a server as a managed unit and wait until it is ready",
                       description="Start COMMAND as the managed unit NAME (its own session, process group and, "
                       "where the host allows, cgroup), with its GPUs verified free and its port unused first, "
                       "and return once it is ready. Units can be declared in gpuslate.toml: 'up A B' starts "
                       "those, one after another, and 'up' alone every unit of the file, in its order, leaving "
                       "those already running as they are and stopping at the first that fails (as "
                       "'docker compose up'). See docs/units.md.",
                       epilog=exit_epilog({**UP_EXITS, 7: "several units: one failed after others were started"}))
    add_common(p)
    p.add_argument("names", metavar="NAME", type=unit_name, nargs="*",
                   help="the unit (several: from the unit file; none: every unit of the file)")
    add_spec_options(p)
    command_after_dashes(p)
    p.add_argument("--clear", action="store_true", help="clear the GPUs first (with 'gpuslate clear' rules)")
    p.add_argument("--max-used", type=size, metavar="SIZE", help="most memory a free GPU may show (default: as clear)")
    p.set_defaults(handler=run)


def unit_name(text: str) -> str:
    """The argparse type of every unit name (``up``/``down``/``logs`` NAME, ``swap`` OLD and NEW):
    the one :class:`~gpuslate.units.names.UnitName` type, so a bad name is exit 2 before anything."""
    from ...units.names import UnitName  # lazy: startup; here, not at the top: the units package is heavy to import

    try:
        return UnitName(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


unit_name.__name__ = "unit name"  # argparse names the type in its own messages


def command_after_dashes(p: argparse.ArgumentParser) -> None:
    """Everything after the first ``--`` is the server's command, verbatim.

    argparse alone cannot do this once NAME was matched before the options
    (a ``nargs='*'`` positional is then already consumed, empty), so the
    words after ``--`` are taken off before this subcommand's parser runs.
    """
    p.usage = f"{p.prog} NAME [options] -- COMMAND [ARGS...]\n       {p.prog} [NAME...] [options]"
    parse = p.parse_known_args

    def parse_known_args(args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        command: list[str] = []
        if "--" in args:
            i = args.index("--")
            args, command = args[:i], args[i + 1:]
        ns, extras = parse(args, namespace)
        ns.command = command
        return ns, extras

    p.parse_known_args = parse_known_args  # type: ignore[method-assign]


def add_spec_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="PATH",
                   help="unit file (default: $GPUSLATE_CONFIG, else gpuslate.toml here or in a folder above)")
    p.add_argument("--gpus", type=gpus_arg, metavar="LIST",
                   help="GPUs of the unit, exported as CUDA_VISIBLE_DEVICES, e.g. 0-7; all: every GPU (its "
                   "environment's CUDA_VISIBLE_DEVICES left as it is)")
    p.add_argument("--port", type=port_type, metavar="PORT", help="the port it serves on (checked unused first)")
    p.add_argument("--ready-host", metavar="ADDR", help="address readiness checks use (default 127.0.0.1)")
    p.add_argument("--engine", choices=tuple(BACKENDS),
                   help="readiness like the engine: " + "; ".join(f"{n}: {e.readiness.what}"
                                                                    for n, e in BACKENDS.items()))
    p.add_argument("--ready", metavar="URL", dest="ready_url", help="ready when GET URL (or a path) answers 200")
    p.add_argument("--ready-log", metavar="REGEX", help="ready when a log line matches REGEX")
    p.add_argument("--smoke", action="store_true", default=None, help="once ready, send one real 1-token completion")
    p.add_argument("--model", help="model name for --smoke (default: the first of /v1/models)")
    p.add_argument("--start-timeout", type=positive_float, metavar="SECONDS", help="default 900")
    p.add_argument("--grace", type=nonnegative_float, metavar="SECONDS",
                   help="SIGTERM to SIGKILL when stopping (default 10)")
    p.add_argument("--stop-timeout", type=nonnegative_float, metavar="SECONDS",
                   help="stopping including GPU memory release (default 60)")
    p.add_argument("--env", action="append", metavar="KEY=VALUE", help="set in the server's environment (repeatable)")
    p.add_argument("--cwd", metavar="DIR", help="working directory of the server")
    p.add_argument("--containment", choices=("auto", "cgroup", "scope", "session"),
                   help="how the unit is fenced in (default auto: cgroup, else systemd scope, else session)")
    p.add_argument("--front", metavar="[HOST:]PORT",
                   help="clients use PORT (on 127.0.0.1 unless HOST is given): a proxy (Caddy, the front "
                   "extra) that holds their requests while swap or restart replaces the unit")


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    env = None
    if args.env:
        env = {}
        for item in args.env:
            key, eq, value = item.partition("=")
            if not eq or not key:
                raise UsageError(f"invalid --env {item!r}: expected KEY=VALUE")
            env[key] = value
    return {"gpus": args.gpus, "port": args.port, "ready_host": args.ready_host, "engine": args.engine,
            "ready_url": args.ready_url, "ready_log": args.ready_log, "smoke": args.smoke, "model": args.model,
            "start_timeout": args.start_timeout, "grace": args.grace, "stop_timeout": args.stop_timeout,
            "env": env, "cwd": args.cwd, "containment": args.containment,
            "front": front_arg(args.front) if args.front is not None else None}


def front_arg(value: str) -> str:
    from ...units.front import parse_front_option  # lazy: startup

    return parse_front_option(value)


def file_units(config: str | None, verb: str) -> list[str]:
    """Every unit of the unit file, in its order: what ``up``/``down``/``restart`` without a name act on."""
    from ...units.names import UnitName  # lazy: startup
    from ...units.spec import CONFIG_NAME, CONFIG_VAR, find_config, load_config  # lazy: startup

    path = find_config(config)
    if path is None:
        raise UsageError(f"{verb} without a NAME acts on every unit of the unit file, and there is none "
                         f"({CONFIG_NAME} here or above, {CONFIG_VAR}, --config)", hint=f"gpuslate {verb} NAME")
    try:
        names: list[str] = [UnitName(n) for n in load_config(path)]
    except UsageError as exc:  # a table whose name no unit can have: the file is at fault
        raise UsageError(f"{path}: {exc}") from None
    if not names:
        raise UsageError(f"{path} defines no [units.NAME] table")
    return names


def run(args: argparse.Namespace) -> int:
    from ...api import Host  # lazy: startup
    from ...units import UpOptions  # lazy: startup
    from ...units.interrupts import stop_signals_interrupt  # lazy: startup
    from ...units.resolving import spec_for  # lazy: startup

    command = list(args.command)
    if len(args.names) != 1:
        return run_many(args, command)
    name = args.names[0]
    with LiveLine.of(args) as live, Host.open(getattr(args, "sim", None), on_event=live.note,
                                              on_progress=live.sink) as host:
        spec = spec_for(host, name, config=args.config, overrides=overrides(args), command=command or None)
        with stop_signals_interrupt():  # a SIGTERM or SIGHUP cleans up like Ctrl-C (exit 130)
            result = host.up(spec, UpOptions(clear_first=args.clear, max_used=args.max_used))
    return present(args, result)


def run_many(args: argparse.Namespace, command: list[str]) -> int:
    """``up A B ...`` or ``up``: the units of the unit file (or their last runs), one after another."""
    from ...api import Host  # lazy: startup
    from ...units import UpOptions, up_many  # lazy: startup
    from ...units.interrupts import stop_signals_interrupt  # lazy: startup
    from ...units.resolving import spec_for  # lazy: startup

    if command:
        raise UsageError("a command after '--' is one unit's: give it one NAME")
    given = sorted("--" + ("ready" if k == "ready_url" else k.replace("_", "-"))
                   for k, v in overrides(args).items() if v is not None)
    if given:
        raise UsageError(f"{', '.join(given)} define{'s' if len(given) == 1 else ''} one unit: with several "
                         "units (or none named), each takes its own from the unit file")
    names = list(dict.fromkeys(args.names)) or file_units(args.config, "up")
    with LiveLine.of(args) as live, Host.open(getattr(args, "sim", None), on_event=live.note,
                                              on_progress=live.sink) as host:
        specs = [spec_for(host, name, config=args.config) for name in names]  # all before anything starts
        with stop_signals_interrupt():
            result = up_many(host, specs, UpOptions(clear_first=args.clear, max_used=args.max_used))
    return present(args, result)

