"""`python units_cli.py ARGS`: the gpuslate CLI with the unit commands registered
(until cli/main.py lists them itself)."""

from __future__ import annotations

import sys

from gpuslate.cli import down, logs, main, ps, swap, up

main.COMMANDS = tuple(main.COMMANDS) + tuple(m for m in (up, down, ps, logs, swap) if m not in main.COMMANDS)

if __name__ == "__main__":
    sys.exit(main.main())
