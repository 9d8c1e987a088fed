"""A real Slurm cluster in a temporary folder: munged, slurmctld and one slurmd per node.

Started as root (Slurm's daemons need it), on loopback ports chosen free, with
its own munge key and socket, so nothing of the machine's own Slurm or munge
(if any) is touched. Several ``slurmd`` run on one machine under distinct
``NodeName``\\ s and ports (``slurmd -N NAME``; Debian's 22.05 allows it).

GPUs: Slurm's GRES needs character devices for ``File=``; each node gets a
folder of device nodes made with ``mknod`` (``c 1 3``, ``c 1 5``, ... :
/dev/null, /dev/zero...; never opened), one per GPU, in ``gres.conf`` order.
GRES index *i* of node N is GPU *i* of N's simulated host ``ROOT/sim-N``: the
Prolog/Epilog wrappers and the ``--slurm`` remote command pick
``GPUSLATE_SIM=ROOT/sim-$SLURMD_NODENAME``. ``TaskProlog`` is ``gpuslate slurm
task-prolog``: every task gets ``SPT_NOENV=1``.

``stop()`` cancels every job, then ends exactly the daemons it started (by the
pids they wrote) and any ``slurmstepd`` left of its jobs.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from gpuslate.gpu.simhost.host import SimHost
from gpuslate.proc.procfs import list_pids, read_cmdline, read_stat

BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "sbatch", "srun", "salloc", "squeue")
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
#: GRES device nodes: (major, minor) of harmless character devices, one per GPU
DEVICE_NUMBERS = [(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (1, 11), (5, 0), (5, 2)]
SRC = str(Path(__file__).resolve().parents[2] / "src")


def missing() -> str | None:
    """Why no cluster can start here, or None."""
    if os.geteuid() != 0:
        return "Slurm's daemons need root"
    lacking = [b for b in BINARIES if shutil.which(b, path=SYSTEM_PATH) is None]
    if lacking:
        return f"no {', '.join(lacking)}: apt-get install slurmctld slurmd slurm-client munge"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SlurmCluster:
    def __init__(self, root: Path, nodes: Sequence[str] = ("n1", "n2"), gpus: dict[str, int] | None = None,
                 hook_timeout: float = 3.0) -> None:
        self.root = root
        self.nodes = list(nodes)
        self.gpus = gpus or dict.fromkeys(nodes, 4)
        self.hook_timeout = hook_timeout
        self.conf = root / "slurm.conf"
        self.hooks = root / "hooks"
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SALLOC_", "SBATCH_",
                                                                              "SRUN_", "GPUSLATE_"))},
                    "SLURM_CONF": str(self.conf)}
        self.env["PATH"] = self.env.get("PATH", "") + os.pathsep + SYSTEM_PATH
        self.env["PYTHONPATH"] = SRC + (os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else "")
        self._pidfiles: list[Path] = []

    # -- the simulated hosts behind the nodes ----------------------------------------
    def sim(self, node: str) -> SimHost:
        return SimHost(self.root / f"sim-{node}")

    def reset_sim(self, node: str) -> SimHost:
        return SimHost.init(self.root / f"sim-{node}", gpus=self.gpus[node], memory=80 * 1024**3,
                            release_delay=0.1)

    # -- start and stop ------------------------------------------------------------
    def start(self, timeout: float = 20.0) -> None:
        r = self.root
        for d in ("state", "log", "munge", "hooks", *(f"spool/{n}" for n in self.nodes)):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o700)
        key = r / "munge" / "key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        self._daemon(["munged", f"--key-file={key}", f"--socket={r}/munge/sock", f"--pid-file={r}/munge/pid",
                      f"--log-file={r}/munge/log", f"--seed-file={r}/munge/seed", "--force"], r / "munge" / "pid")
        gres_lines = []
        for n in self.nodes:
            self.reset_sim(n)
            dev = r / "gres" / n
            dev.mkdir(parents=True)
            for i in range(self.gpus[n]):
                major, minor = DEVICE_NUMBERS[i]
                os.mknod(dev / f"gpu{i}", 0o600 | 0o020000, os.makedev(major, minor))
            gres_lines.append(f"NodeName={n} Name=gpu File={dev}/gpu[0-{self.gpus[n] - 1}]")
        (r / "gres.conf").write_text("\n".join(gres_lines) + "\n")
        (r / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        self._write_hooks()
        self.conf.write_text(self._slurm_conf())
        self._daemon(["slurmctld", "-f", str(self.conf), "-i"], r / "slurmctld.pid")
        for n in self.nodes:
            self._daemon(["slurmd", "-f", str(self.conf), "-N", n], r / f"slurmd-{n}.pid")
        deadline = time.monotonic() + timeout
        while self.states() != dict.fromkeys(self.nodes, "idle"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Slurm test cluster did not come up: {self.states()}\n" + self.logs())
            time.sleep(0.1)

    def _slurm_conf(self) -> str:
        r, host = self.root, socket.gethostname()
        lines = [
            "ClusterName=gpuslatetest", f"SlurmctldHost={host}(127.0.0.1)", "SlurmUser=root", "SlurmdUser=root",
            f"SlurmctldPort={free_port()}", "AuthType=auth/munge", "CredType=cred/munge",
            # cred_expire: a requeued job may start again this soon (default 120 s)
            f"AuthInfo=socket={r}/munge/sock,cred_expire=5", f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool/%n", f"SlurmctldPidFile={r}/slurmctld.pid", f"SlurmdPidFile={r}/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log", f"SlurmdLogFile={r}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
            "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "GresTypes=gpu", "ReturnToService=2", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "SlurmdParameters=config_overrides",
            # a job requeued by a failed Prolog runs again once the node is resumed, not held
            "SchedulerParameters=nohold_on_prolog_fail", "MessageTimeout=5",
            # job ids far from any job this test may itself run inside
            f"FirstJobId={700000 + os.getpid() % 100000}",
            f"Prolog={self.hooks}/prolog.sh", f"Epilog={self.hooks}/epilog.sh",
            f"TaskProlog={self.hooks}/task-prolog.sh",
        ]
        for n in self.nodes:
            lines.append(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} CPUs=2 "
                         f"Gres=gpu:{self.gpus[n]} State=UNKNOWN")
        lines.append("PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _write_hooks(self) -> None:
        """The Prolog/Epilog: two lines, as docs/slurm.md shows, plus this node's simulated host."""
        for hook in ("prolog", "epilog"):
            path = self.hooks / f"{hook}.sh"
            path.write_text(
                "#!/bin/sh\n"
                f"export GPUSLATE_SIM={self.root}/sim-$SLURMD_NODENAME PYTHONPATH={SRC}\n"
                f"exec {sys.executable} -m gpuslate slurm {hook} --timeout {self.hook_timeout:g}"
                f"{' --grace 1' if hook == 'epilog' else ''} --json "
                f">{self.hooks}/{hook}-$SLURM_JOB_ID-$SLURMD_NODENAME.json "
                f"2>{self.hooks}/{hook}-$SLURM_JOB_ID-$SLURMD_NODENAME.err\n")
            path.chmod(0o755)
        task = self.hooks / "task-prolog.sh"  # as docs/slurm.md shows: every task gets SPT_NOENV=1
        task.write_text(f"#!/bin/sh\nexport PYTHONPATH={SRC}\nexec {sys.executable} -m gpuslate slurm task-prolog\n")
        task.chmod(0o755)
        node_cmd = self.hooks / "gpuslate-on-node"
        node_cmd.write_text("#!/bin/sh\n"
                            f"export GPUSLATE_SIM={self.root}/sim-$SLURMD_NODENAME PYTHONPATH={SRC}\n"
                            f'exec {sys.executable} -m gpuslate "$@"\n')
        node_cmd.chmod(0o755)

    def _daemon(self, argv: list[str], pidfile: Path) -> None:
        p = subprocess.run(argv, env=self.env, cwd=self.root, capture_output=True, text=True, timeout=30)
        self._pidfiles.append(pidfile)
        if p.returncode != 0:
            raise RuntimeError(f"{argv[0]} did not start: {p.stderr.strip()}\n{self.logs()}")

    def stop(self) -> None:
        """Cancel every job and wait for their steps to end, then end the daemons (their pid files)
        and any ``slurmstepd`` of this cluster still there (found by its working folder, in ROOT)."""
        try:
            subprocess.run(["scancel", "--full", "--user=root"], env=self.env, capture_output=True, timeout=10)
            deadline = time.monotonic() + 15
            while (self._stepds() or self.run("squeue", "-h", check=False).stdout.strip()) \
                    and time.monotonic() < deadline:
                time.sleep(0.1)
        except (OSError, subprocess.TimeoutExpired):
            pass
        pids = []
        for pidfile in reversed(self._pidfiles):
            try:
                pids.append(int(pidfile.read_text().split()[0]))
            except (OSError, ValueError, IndexError):
                continue
        pids += self._stepds()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        for pid in pids:
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _stepds(self) -> list[int]:
        """This cluster's slurmstepd processes: titled ``slurmstepd: [JOB.STEP]``, working in ROOT."""
        out = []
        for pid in list_pids():
            argv = read_cmdline(pid)
            if argv and argv[0].startswith(("slurmstepd", "/usr/sbin/slurmstepd")) \
                    and _cwd(pid).startswith(str(self.root)) and _alive(pid):
                out.append(pid)
        return out

    # -- asking Slurm --------------------------------------------------------------
    def run(self, *argv: str, timeout: float = 30, check: bool = True,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        p = subprocess.run(list(argv), env={**self.env, **(env or {})}, capture_output=True, text=True,
                           timeout=timeout, cwd=self.root)
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr}")
        return p

    def states(self) -> dict[str, str]:
        p = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        return dict(line.split()[:2] for line in p.stdout.splitlines() if len(line.split()) >= 2)

    def node(self, name: str) -> dict[str, str]:
        out = self.run("scontrol", "-o", "show", "node", name).stdout
        fields = {}
        for word in out.replace("Reason=", "\nReason=").split("\n")[0].split():
            k, _, v = word.partition("=")
            fields[k] = v
        if "Reason=" in out:
            fields["Reason"] = out.split("Reason=", 1)[1].strip()
        return fields

    def job(self, job_id: int) -> dict[str, str]:
        out = self.run("scontrol", "-o", "show", "job", str(job_id), check=False).stdout
        return dict(w.partition("=")[::2] for w in out.split() if "=" in w)

    def sbatch(self, *args: str) -> int:
        out = self.run("sbatch", "--parsable", f"--chdir={self.root}", *args).stdout
        return int(out.strip().split(";")[0])

    def resume(self, node: str) -> None:
        self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)

    def logs(self) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*.log")):
            out.append(f"== {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(out)


def _alive(pid: int) -> bool:
    st = read_stat(pid)
    return st is not None and st.state not in ("Z", "X")


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""
