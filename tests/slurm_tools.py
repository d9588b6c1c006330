"""A real SLURM for the tests: munged, slurmctld and slurmd as a one-node cluster on this machine, in a folder.

Used by ``tests/test_slurm_real.py``. Debian's packages (``slurmctld slurmd slurm-client munge``, which
``make system-deps`` installs as root) run without systemd and without cgroups: processes are tracked by
``proctrack/linuxproc``, tasks are not bound (``task/none``), and the node is described by what ``slurmd -C``
reads from this machine (its CPUs and memory). Every file -- configuration, munge key and socket, state,
spool, logs, pid files -- lives in one temporary folder; the ports are chosen free; the daemons are stopped
by the pids they wrote. Nothing outside the folder is touched, so two runs (or another SLURM) can coexist.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

__all__ = ["DAEMONS", "LocalSlurm", "missing"]

#: What a one-node cluster needs on PATH (Debian: slurmctld, slurmd, slurm-client, munge).
DAEMONS = ("munged", "munge", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "scancel")
#: Job states after which a job no longer runs.
DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
        "DEADLINE"}


def missing() -> str:
    """Why a real SLURM cannot start here ('' when it can): the programs, root (slurmd starts jobs as their
    user), Linux."""
    if not hasattr(os, "geteuid") or not Path("/proc/self/status").exists():
        return "a real SLURM needs Linux"
    absent = [p for p in DAEMONS if not shutil.which(p) and not Path("/usr/sbin", p).exists()]
    if absent:
        return (f"{', '.join(absent)} not found: install Debian's slurmctld slurmd slurm-client munge "
                "(make system-deps does, as root)")
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs"
    return ""


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and re.search(r"^State:\s+Z", status.read_text(), flags=re.M))


class LocalSlurm:
    """A one-node SLURM cluster in a temporary folder. ``start()``, then ``submit``/``wait``; ``stop()`` always."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="gpucourse-slurm-"))
        self.root.chmod(0o711)  # munged wants its socket's folder searchable by everyone
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.pid_files = {"slurmd": self.root / "run" / "slurmd.pid",
                          "slurmctld": self.root / "run" / "slurmctld.pid",
                          "munged": self.root / "munge" / "munged.pid"}
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM")},
                    "SLURM_CONF": str(self.conf)}
        self.hardware = ""

    # ------------------------------------------------------------------ daemons

    def _write_conf(self) -> None:
        for sub in ("state", "spool", "log", "run"):
            (self.root / sub).mkdir()
        self.hardware = subprocess.run([_exe("slurmd"), "-C"], capture_output=True, text=True, timeout=30,
                                       check=True).stdout.splitlines()[0]
        hw = re.sub(r"^NodeName=\S+\s*", "", self.hardware)  # CPUs=2 Boards=1 ... RealMemory=24105
        ctld, slurmd = _free_ports(2)
        (self.root / "plugstack.conf").write_text("")
        self.conf.write_text(f"""\
ClusterName=gpucourse
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={slurmd}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.root}/munge/munge.socket
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
InactiveLimit=0
KillWait=30
MinJobAge=600
Waittime=0
MailProg=/bin/true
PlugStackConfig={self.root}/plugstack.conf
StateSaveLocation={self.root}/state
SlurmdSpoolDir={self.root}/spool
SlurmctldPidFile={self.pid_files['slurmctld']}
SlurmdPidFile={self.pid_files['slurmd']}
SlurmctldLogFile={self.root}/log/slurmctld.log
SlurmdLogFile={self.root}/log/slurmd.log
NodeName={self.node} NodeAddr=127.0.0.1 {hw} State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")

    def start(self, timeout: float = 60) -> "LocalSlurm":
        """Write the configuration and a munge key, start munged, slurmctld and slurmd, wait for the node idle."""
        self._write_conf()
        munge = self.root / "munge"
        munge.mkdir(mode=0o711)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o400)
        self._run([_exe("munged"), f"--socket={munge}/munge.socket", f"--key-file={key}",
                   f"--pid-file={self.pid_files['munged']}", f"--log-file={munge}/munged.log",
                   f"--seed-file={munge}/munged.seed"])
        self._run([_exe("slurmctld"), "-c"])
        self._run([_exe("slurmd"), "-N", self.node])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.cmd("sinfo", "-h", "-o", "%t", check=False).stdout.strip()
            if state == "idle":
                return self
            time.sleep(0.2)
        raise RuntimeError(f"the node did not become idle within {timeout:g} s (sinfo: {state!r}):\n{self.logs()}")

    def _run(self, argv: list[str]) -> None:
        out = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {out.returncode}: {out.stderr.strip()}\n{self.logs()}")

    def pids(self) -> dict[str, int]:
        """The daemons' pids, from the pid files they wrote."""
        out = {}
        for name, path in self.pid_files.items():
            if path.exists() and path.read_text().strip().isdigit():
                out[name] = int(path.read_text().strip())
        return out

    def stop(self) -> None:
        """Cancel every job, stop slurmd, slurmctld and munged by their pids (SIGTERM, then SIGKILL), remove the
        folder."""
        if self.conf.exists() and self.pids().get("slurmctld"):
            jobs = self.cmd("squeue", "-h", "-o", "%i", check=False).stdout.split()
            if jobs:
                self.cmd("scancel", *jobs, check=False)
        for name in ("slurmd", "slurmctld", "munged"):
            pid = self.pids().get(name)
            if not pid or not _alive(pid):
                continue
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)

    def logs(self) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*.log")) + [self.root / "munge" / "munged.log"]:
            if path.exists():
                parts.append(f"--- {path.name} (last lines)\n" + "\n".join(path.read_text().splitlines()[-15:]))
        return "\n".join(parts)

    # ------------------------------------------------------------------ jobs

    def cmd(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        out = subprocess.run([_exe(argv[0]), *argv[1:]], env=self.env, capture_output=True, text=True,
                             timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {out.returncode}: {out.stderr.strip()}")
        return out

    def submit(self, script: Path, *options: str, env: dict | None = None, cwd: Path | None = None) -> int:
        """``sbatch [options] script`` from ``cwd``, with ``env`` over this process's environment and this
        cluster's ``SLURM_CONF``; sbatch hands that environment on to the job."""
        out = subprocess.run([_exe("sbatch"), "--parsable", *options, str(script)], cwd=cwd, capture_output=True,
                             env={**self.env, **(env or {}), "SLURM_CONF": str(self.conf)}, text=True, timeout=30)
        if out.returncode != 0:
            raise RuntimeError(f"sbatch exited {out.returncode}: {out.stderr.strip()}")
        return int(out.stdout.strip().split(";")[0])

    def job(self, job: int) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, ExitCode, RunTime, Reason, ...)."""
        text = self.cmd("scontrol", "show", "job", "-o", str(job)).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait(self, job: int, timeout: float) -> dict[str, str]:
        """Poll until the job has ended (sbatch --wait polls ever more slowly); cancel it after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job)
            if info.get("JobState") in DONE:
                return info
            if time.monotonic() > deadline:
                self.cmd("scancel", str(job), check=False)
                pytest.fail(f"job {job} still {info.get('JobState')} after {timeout:g} s (reason "
                            f"{info.get('Reason')}); cancelled\n{self.logs()}")
            time.sleep(0.2)

    def task_pids(self, job: int, step: int) -> dict[int, int]:
        """{task rank: pid} of a running job step (``scontrol listpids``)."""
        out = self.cmd("scontrol", "listpids", f"{job}.{step}", check=False).stdout
        pids = {}
        for line in out.splitlines()[1:]:
            f = line.split()
            if len(f) >= 5 and f[0].isdigit() and f[4].isdigit():
                pids[int(f[4])] = int(f[0])
        return pids
