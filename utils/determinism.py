"""Reproducible training: train the same small model in fresh processes and compare the weights bit for bit.

``tf.config.experimental.enable_op_determinism()`` is process-wide and cannot
be turned off again, so the course never calls it in a notebook's kernel:
:func:`run_trainings` starts one fresh process per :class:`TrainingSetup`
(through :mod:`gpucourse._probe`), each of which seeds, optionally enables op
determinism, shuffles its data with ``tf.data``, trains for a few steps and
reports a digest of its final weights, plus what Keras resolved
``jit_compile`` to. :func:`compare_runs` says whether two runs are
bit-identical and, if not, how far apart they are.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass, field

from . import _probe, _validate

__all__ = ["TRAIN_CODE", "TrainingRun", "TrainingSetup", "compare_runs", "run_trainings", "weights_digest"]

#: The program each fresh process runs: argv = seed, shuffle seed, deterministic (1/0). "-" means no seed.
TRAIN_CODE = r"""
import sys, hashlib, struct, warnings
import numpy as np, tensorflow as tf, keras

seed, shuffle_seed, deterministic = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if seed != "-":
    keras.utils.set_random_seed(int(seed))          # Python, NumPy and TensorFlow's global seed
if deterministic:
    tf.config.experimental.enable_op_determinism()  # process-wide, cannot be undone

data = np.random.default_rng(6)                      # the data itself is fixed in every run
X = data.normal(size=(512, 16)).astype("float32")
y = (X @ data.normal(size=(16, 1)) + 0.1 * data.normal(size=(512, 1))).astype("float32")
ds = (tf.data.Dataset.from_tensor_slices((X, y, np.arange(512)))
      .shuffle(512, seed=None if shuffle_seed == "-" else int(shuffle_seed))
      .batch(64))
first_batch = [int(i) for i in next(iter(ds))[2][:6]]

def model(jit):
    m = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m.compile(keras.optimizers.Adam(1e-2), "mse", jit_compile=jit)
    return m, [str(w.message) for w in caught if "jit_compile" in str(w.message)]

net, _ = model("auto")
net.fit(ds.map(lambda a, b, i: (a, b)), epochs=3, verbose=0)
explicit, warned = model(True)
flat = np.concatenate([w.numpy().ravel() for w in net.weights]).astype("float32")
emit({"digest": hashlib.sha256(flat.tobytes()).hexdigest(), "weights": flat.tolist(),
      "first_batch": first_batch, "determinism": deterministic,
      "jit_auto": bool(net.jit_compile), "jit_true": bool(explicit.jit_compile), "jit_warning": warned[:1],
      "devices": sorted({d.device_type for d in tf.config.list_logical_devices()})})
"""


@dataclass(frozen=True)
class TrainingSetup:
    """How one fresh process trains: seeds (None = unseeded) and whether op determinism is on."""

    label: str
    seed: int | None = 0
    shuffle_seed: int | None = 0
    deterministic: bool = True
    cpu_only: bool = True  # hide any GPU, so the answer is the same on every machine

    def probe(self) -> _probe.Probe:
        _validate.text("label", self.label)
        for name in ("seed", "shuffle_seed"):
            value = getattr(self, name)
            if value is not None:
                _validate.whole(name, value, 0)
        for name in ("deterministic", "cpu_only"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        args = ["-" if self.seed is None else str(self.seed), "-" if self.shuffle_seed is None else str(self.shuffle_seed),
                "1" if self.deterministic else "0"]
        env = {"CUDA_VISIBLE_DEVICES": "-1"} if self.cpu_only else {}
        return _probe.Probe(TRAIN_CODE, args, env, label=self.label)


@dataclass
class TrainingRun:
    """What one fresh process reported."""

    setup: TrainingSetup
    digest: str
    weights: list[float] = field(repr=False)
    first_batch: list[int]
    jit_auto: bool
    jit_true: bool
    jit_warning: list[str]
    devices: list[str]

    @property
    def label(self) -> str:
        return self.setup.label

    def __str__(self) -> str:
        s = self.setup
        seeds = f"seed={s.seed}, shuffle seed={s.shuffle_seed}"
        return (f"{s.label}: {seeds}, op determinism {'on' if s.deterministic else 'off'} -> weights "
                f"{self.digest[:12]}, first batch {self.first_batch}")


def weights_digest(values) -> str:
    """SHA-256 of float32 values, as the probe computes it (equal digests = bit-identical weights)."""
    return hashlib.sha256(b"".join(struct.pack("<f", float(v)) for v in values)).hexdigest()


def run_trainings(setups, timeout: float = 300) -> list[TrainingRun]:
    """Run each :class:`TrainingSetup` in its own fresh process, all at once; one run per setup, in order.

    Raises :class:`gpucourse._probe.ProbeError` (a RuntimeError) if a process fails.
    """
    if isinstance(setups, TrainingSetup):
        setups = [setups]
    setups = list(setups)
    if not setups or not all(isinstance(s, TrainingSetup) for s in setups):
        raise TypeError("setups must be a non-empty list of TrainingSetup(label, seed, shuffle_seed, deterministic)")
    labels = [s.label for s in setups]
    if len(set(labels)) != len(labels):
        raise ValueError(f"setup labels must be unique, got {labels}")
    answers = _probe.run_many([s.probe() for s in setups], timeout=timeout)
    runs = []
    for setup, answer in zip(setups, answers):
        if isinstance(answer, Exception):
            raise answer
        runs.append(TrainingRun(setup, answer["digest"], answer["weights"], answer["first_batch"],
                                answer["jit_auto"], answer["jit_true"], answer["jit_warning"], answer["devices"]))
    return runs


def compare_runs(a: TrainingRun, b: TrainingRun) -> dict:
    """``{"identical": bool, "max_abs_diff": float, "differing": int}`` over the two runs' final weights."""
    for name, run in (("a", a), ("b", b)):
        if not isinstance(run, TrainingRun):
            raise TypeError(f"{name} must be a TrainingRun from run_trainings, got {type(run).__name__}")
    if len(a.weights) != len(b.weights):
        raise ValueError(f"the runs trained different models ({len(a.weights)} vs {len(b.weights)} weights)")
    diffs = [abs(x - y) for x, y in zip(a.weights, b.weights)]
    nan_mismatch = sum(math.isnan(x) != math.isnan(y) for x, y in zip(a.weights, b.weights))
    return {"identical": a.digest == b.digest, "max_abs_diff": max(diffs, default=0.0),
            "differing": sum(d > 0 for d in diffs) + nan_mismatch}
