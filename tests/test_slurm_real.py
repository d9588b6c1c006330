"""The SLURM template on a real SLURM: docs/clusters/slurm_multiworker.sbatch, submitted with sbatch.

A one-node cluster on this machine (munged, slurmctld, slurmd: ``tests/slurm_tools.py``) runs the
repository's own template in the CPU form its comments document -- the same file, with
``sbatch --gres=none --nodes=1 --ntasks-per-node=2 --cpus-per-task=1`` and the variables CKPT_DIR, VENV,
STEPS, SAVE_EVERY and PORT_BASE -- not a copy. It checks a clean run; a ``kill -9`` of the
chief mid-training, after which the template's loop restarts the step and it resumes from the checkpoint
with final weights equal to the clean run's; and the two configuration errors the checks catch before
TensorFlow starts (a port in use, a checkpoint folder it cannot write), which end the job with exit code 2
and no retry. Skips where SLURM cannot start (no packages, not root); fails instead when CI=true.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gpucourse import multiworker
from tests.slurm_tools import LocalSlurm, missing

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parent.parent
SBATCH = ROOT / "docs" / "clusters" / "slurm_multiworker.sbatch"
#: The CPU form, as the template's comments give it (options on sbatch's command line override #SBATCH lines).
CPU_FORM = ("--gres=none", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1")
STEPS, SAVE_EVERY, KILL_AFTER = 300, 50, 100
JOB_TIMEOUT = 240
SUMMARY = re.compile(r"^(\d): worker (\d) of 2( \(chief\))?: resumed from step (\d+), trained to step (\d+) in "
                     r"[\d.]+ s \(2 replicas in sync\); checkpoints at steps [^;]+; weights sha256 ([0-9a-f]{16}); "
                     r"final weights: (.+)$", flags=re.M)
#: What TensorFlow logs when a worker waits for a peer that has already left (the tail of docs/clusters/README.md).
TAIL = re.compile(r"tasks are unhealthy|Failed to send RPC to coordination service")


@pytest.fixture(scope="module")
def slurm():
    why = missing()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"a real SLURM is required in CI: {why}")
        pytest.skip(f"no real SLURM here: {why}")
    cluster = LocalSlurm()
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def _free_pair() -> int:
    """A port p with p and p + 1 free: the job's PORT_BASE. The template's own choice (from the job id) is tested
    in test_train_multiworker.py; here another SLURM on this machine (another test run) may number its jobs alike."""
    for _ in range(50):
        base = multiworker.free_ports(1)[0]
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("0.0.0.0", base))
                b.bind(("0.0.0.0", base + 1))
            return base
        except OSError:
            continue
    pytest.skip("no two consecutive free ports")


def _env(folder: Path, **more) -> dict:
    clean = {k: v for k, v in os.environ.items()
             if not re.match(r"^(SLURM.*|TF_CONFIG|JOB_COMPLETION_INDEX|TRAIN_.*|CUDA_VISIBLE_DEVICES)$", k)}
    return {**clean, "CKPT_DIR": str(folder / "ckpt"), "VENV": str(Path(sys.executable).parent.parent),
            "STEPS": str(STEPS), "SAVE_EVERY": str(SAVE_EVERY), "CUDA_VISIBLE_DEVICES": "-1",
            "PORT_BASE": str(_free_pair()), **more}


def _log(folder: Path, job: int) -> str:
    path = folder / f"tf-multiworker-{job}.out"
    return path.read_text(errors="replace") if path.exists() else "(no log)"


def _summaries(log: str) -> dict[int, re.Match]:
    found = {int(m.group(1)): m for m in SUMMARY.finditer(log)}
    assert set(found) == {0, 1}, f"expected one summary line per task:\n{log[-4000:]}"
    for task, m in found.items():
        assert int(m.group(2)) == task and len(m.group(0)) < 1024, m.group(0)  # SLURM passes on ~1 KB pieces
    return found


@pytest.fixture(scope="module")
def clean(slurm, tmp_path_factory):
    """The template's clean run. Returns (final weights, log)."""
    folder = tmp_path_factory.mktemp("clean")
    job = slurm.submit(SBATCH, *CPU_FORM, env=_env(folder), cwd=folder)
    info = slurm.wait(job, JOB_TIMEOUT)
    log = _log(folder, job)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), f"{info}\n{log[-4000:]}"
    return np.load(folder / "ckpt" / "final_weights.npy"), log


def test_clean_run_trains_both_tasks_in_step(clean):
    _, log = clean
    for task in (0, 1):
        assert f"{task}: checks passed: cluster source: SLURM" in log
        assert re.search(rf"^{task}: cluster source: SLURM \(SlurmClusterResolver, SLURM's order: "
                         rf"SLURM_PROCID={task}, SLURM_STEP_NUM_TASKS=2", log, flags=re.M), log[-4000:]
    s = _summaries(log)
    assert [s[t].group(4) for t in (0, 1)] == ["0", "0"] and s[0].group(3) and not s[1].group(3)
    assert s[0].group(6) == s[1].group(6), "both workers must end with the same weights"
    assert "training finished (attempt 1 of 3)" in log and "restarting" not in log
    assert not TAIL.search(log), f"a worker waited for a peer that had left:\n{log[-4000:]}"


def _sigterm_caught(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    return bool(int(re.search(r"^SigCgt:\s+([0-9a-f]+)", status, flags=re.M).group(1), 16) & (1 << 14))


def test_kill_9_of_the_chief_resumes_from_the_checkpoint_with_the_same_weights(slurm, clean, tmp_path):
    want, _ = clean
    job = slurm.submit(SBATCH, *CPU_FORM, env=_env(tmp_path), cwd=tmp_path)
    ckpt = tmp_path / "ckpt"
    deadline = time.monotonic() + JOB_TIMEOUT
    # until the chief has saved step KILL_AFTER (the training step is the job's step 1); saved = named in the
    # manager's state file, which is what a restart reads (a step's .index file exists a moment before)
    while (multiworker.find_resume_step(ckpt) or 0) < KILL_AFTER:
        assert time.monotonic() < deadline and slurm.job(job)["JobState"] in ("PENDING", "RUNNING"), \
            _log(tmp_path, job)[-4000:]
        time.sleep(0.02)
    pids = slurm.task_pids(job, 1)
    assert set(pids) == {0, 1}, pids
    # The survivor must end on srun's SIGTERM: TensorFlow catches it once the strategy runs, the script restores it.
    assert not _sigterm_caught(pids[1]), "the survivor would ignore srun's SIGTERM (multiworker._restore_sigterm)"
    saved = multiworker.find_resume_step(ckpt)
    os.kill(pids[0], 9)
    info = slurm.wait(job, JOB_TIMEOUT)
    log = _log(tmp_path, job)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), f"{info}\n{log[-4000:]}"
    assert "srun: error: " in log and "task 0: Killed" in log, log[-4000:]
    assert re.search(r"^step failed with exit code \d+ \(attempt 1 of 3\); restarting from the last checkpoint",
                     log, flags=re.M), log[-4000:]
    assert "training finished (attempt 2 of 3)" in log and log.count("restarting") == 1
    s = _summaries(log)
    start = int(s[0].group(4))
    # It resumes from the last checkpoint: the one saved before the kill, or the next if it was saved meanwhile.
    assert start == int(s[1].group(4)) and start % SAVE_EVERY == 0, (saved, start)
    assert saved <= start <= min(saved + SAVE_EVERY, STEPS - SAVE_EVERY), (saved, start)
    np.testing.assert_array_equal(np.load(ckpt / "final_weights.npy"), want)
    assert s[0].group(6) == s[1].group(6)
    resumed = log[log.index("(attempt 1 of 3); restarting"):]
    assert not TAIL.search(resumed), f"a worker waited for a peer that had left:\n{resumed[-4000:]}"


def _held_port() -> tuple[int, socket.socket]:
    """A port p with p free and p + 1 held by a listening socket here (as another program would)."""
    for _ in range(50):
        base = multiworker.free_ports(1)[0]
        if base >= 65535:
            continue
        holder = socket.socket()
        try:
            holder.bind(("0.0.0.0", base + 1))
            holder.listen()
            return base, holder
        except OSError:
            holder.close()
    pytest.skip("no free port with a free neighbour")


def test_port_in_use_stops_the_job_at_the_checks_with_exit_2(slurm, tmp_path):
    base, holder = _held_port()
    with holder:
        job = slurm.submit(SBATCH, *CPU_FORM, env=_env(tmp_path, PORT_BASE=str(base)), cwd=tmp_path)
        info = slurm.wait(job, JOB_TIMEOUT)
    log = _log(tmp_path, job)
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "2:0"), f"{info}\n{log[-4000:]}"
    assert re.search(rf"^1: ClusterError: --slurm-port-base: port {base + 1} \(--slurm-port-base {base} \+ 1, task 1 "
                     rf"of this node\) is already in use on .*change the line PORT_BASE=\.\.\. in "
                     rf"docs/clusters/slurm_multiworker\.sbatch", log, flags=re.M), log[-4000:]
    assert "0: checks passed" in log and "checks failed (exit code 2)" in log
    assert "TF_CONFIG=" not in log and "attempt" not in log, "TensorFlow must not start, nor the retry loop"


def test_unwritable_checkpoint_folder_stops_the_job_at_the_checks_with_exit_2(slurm, tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    # Read-only, as a mount the job cannot write (root writes anywhere else); without mount rights, a "folder"
    # that is a file.
    ro = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True).returncode == 0
    if ro and subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True).returncode != 0:
        subprocess.run(["umount", str(folder)], capture_output=True)
        ro = False
    target = folder if ro else tmp_path / "a-file" / "ckpt"
    if not ro:
        (tmp_path / "a-file").write_text("not a folder")
    try:
        job = slurm.submit(SBATCH, *CPU_FORM, env={**_env(tmp_path), "CKPT_DIR": str(target)}, cwd=tmp_path)
        info = slurm.wait(job, JOB_TIMEOUT)
    finally:
        if ro:
            subprocess.run(["umount", str(folder)], capture_output=True)
    log = _log(tmp_path, job)
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "2:0"), f"{info}\n{log[-4000:]}"
    why = "Read-only file system" if ro else "Not a directory"
    for task in (0, 1):
        assert re.search(rf"^{task}: ClusterError: --checkpoint-dir: cannot write to '{re.escape(str(target))}' .*"
                         rf"{why}.*change the line CKPT_DIR=\.\.\. in docs/clusters/slurm_multiworker\.sbatch",
                         log, flags=re.M), log[-4000:]
    assert "checks failed (exit code 2)" in log and "TF_CONFIG=" not in log and "attempt" not in log
