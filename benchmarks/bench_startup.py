"""The start-up of ``status --json`` and ``clear --json`` on this tree and another, where no NVIDIA
driver is: everything a real host's run does before the driver answers (imports, the parser, the
driver's library looked for: exit 3), timed in interleaved rounds with ``python -c pass``.

    python3 benchmarks/bench_startup.py --before OLD_TREE [--rounds 40]

A machine without a GPU cannot time a real host's ``status``; this is the part of it that changes
when the code's imports and command line do (the simulated host, ``bench_status.py --sim``, also
imports the simulator). Bytecode cached, as after a pip install (``PYTHONPYCACHEPREFIX``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = "import sys; sys.argv[0] = 'gpuslate'; from gpuslate.cli import run; run()"  # as the console script


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="the gpuslate source tree to compare with (git archive OLD)")
    ap.add_argument("--rounds", type=int, default=40)
    a = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if k not in ("GPUSLATE_SIM", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    base["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="gpuslate-bench-pyc-")
    commands: dict[str, tuple[list[str], dict[str, str]]] = {"python -c pass": ([sys.executable, "-c", "pass"], base)}
    for label, src in (("before", str(Path(a.before) / "src")), ("after", str(ROOT / "src"))):
        for name, words in (("status --json", ["status", "--json"]), ("clear --json", ["clear", "--json", "--yes"])):
            commands[f"{name} [{label}]"] = ([sys.executable, "-c", RUN, *words], {**base, "PYTHONPATH": src})
    names = list(commands)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(2 + a.rounds):  # 2 warm-up rounds: bytecode and page cache
        for n in names[r % len(names):] + names[:r % len(names)]:
            argv, env = commands[n]
            t0 = time.perf_counter()
            p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
            dt = (time.perf_counter() - t0) * 1000
            if p.returncode not in (0, 3):  # 3: no NVIDIA driver here, the expected end
                raise RuntimeError(f"{n}: exit {p.returncode}: {p.stderr.decode()[-300:]}")
            if r >= 2:
                times[n].append(dt)
    print(f"- {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.uname().nodename}, Python "
          f"{sys.version.split()[0]}; {a.rounds} rounds; load average {os.getloadavg()[0]:.1f}")
    print("\n| command | median ms | p10 ms |\n| --- | ---: | ---: |")
    for n, v in times.items():
        print(f"| {n} | {statistics.median(v):.1f} | {sorted(v)[len(v) // 10]:.1f} |")
    for name in ("status --json", "clear --json"):
        ratio = statistics.median(times[f"{name} [after]"]) / statistics.median(times[f"{name} [before]"])
        print(f"\n{name}: after / before = {ratio:.3f}", end="")
    print()


if __name__ == "__main__":
    main()
