"""Run a command and write its process tree's user and system CPU seconds to a file
(a stand-in for ``/usr/bin/time -f "%U %S"``, which the device image may lack).

    python benchmarks/cpu_time.py OUTFILE COMMAND [ARGS...]
"""

from __future__ import annotations

import os
import subprocess
import sys


def main() -> int:
    out, cmd = sys.argv[1], sys.argv[2:]
    before = os.times()
    code = subprocess.call(cmd)
    after = os.times()
    with open(out, "w") as f:
        f.write(f"{after.children_user - before.children_user:.3f} "
                f"{after.children_system - before.children_system:.3f}\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
