"""gpucourse.determinism: fresh-process training runs with op determinism, compared bit for bit."""

import pytest

from gpucourse import determinism


def fake_answer(weights, first_batch=(3, 1, 4), deterministic=True):
    return {"digest": determinism.weights_digest(weights), "weights": list(weights), "first_batch": list(first_batch),
            "determinism": deterministic, "jit_auto": False, "jit_true": not deterministic,
            "jit_warning": ["Model doesn't support `jit_compile=True`."] if deterministic else [], "devices": ["CPU"]}


def test_run_trainings_reads_the_fresh_processes(monkeypatch):
    # The real processes run in notebook 06 (a checked cell); here the probe layer is faked.
    seen = []

    def run_many(probes, timeout):
        seen.extend(probes)
        return [fake_answer([0.5, -1.25]), fake_answer([0.5, -1.25]), fake_answer([0.5, -1.0], (2, 7, 1))]

    monkeypatch.setattr(determinism._probe, "run_many", run_many)
    a, b, other = determinism.run_trainings([
        determinism.TrainingSetup("run 1"), determinism.TrainingSetup("run 2"),
        determinism.TrainingSetup("other shuffle seed", shuffle_seed=1)])
    assert [p.args for p in seen] == [["0", "0", "1"], ["0", "0", "1"], ["0", "1", "1"]]
    assert all(p.env == {"CUDA_VISIBLE_DEVICES": "-1"} and "enable_op_determinism" in p.code for p in seen)
    assert determinism.TrainingSetup("x", seed=None, deterministic=False, cpu_only=False).probe().args == ["-", "0", "0"]
    assert determinism.compare_runs(a, b) == {"identical": True, "max_abs_diff": 0.0, "differing": 0}
    assert determinism.compare_runs(a, other) == {"identical": False, "max_abs_diff": 0.25, "differing": 1}
    assert "op determinism on" in str(a) and "first batch [2, 7, 1]" in str(other)


def test_a_failed_process_raises(monkeypatch):
    monkeypatch.setattr(determinism._probe, "run_many",
                        lambda probes, timeout: [determinism._probe.ProbeError("run 1: exit code 1")])
    with pytest.raises(RuntimeError, match="exit code 1"):
        determinism.run_trainings(determinism.TrainingSetup("run 1"))


def test_digest_matches_the_probe():
    import hashlib

    import numpy as np

    w = np.float32([0.1, -2.5, 3e-8])
    assert determinism.weights_digest(w.tolist()) == hashlib.sha256(w.tobytes()).hexdigest()


def test_bad_input():
    with pytest.raises(TypeError, match="TrainingSetup"):
        determinism.run_trainings([])
    with pytest.raises(ValueError, match="unique"):
        determinism.run_trainings([determinism.TrainingSetup("a"), determinism.TrainingSetup("a")])
    with pytest.raises(ValueError, match="seed"):
        determinism.TrainingSetup("a", seed=-1).probe()
    with pytest.raises(TypeError, match="deterministic"):
        determinism.TrainingSetup("a", deterministic="yes").probe()
    with pytest.raises(TypeError, match="TrainingRun"):
        determinism.compare_runs("a", "b")
    a = determinism.TrainingRun(determinism.TrainingSetup("a"), "d", [1.0], [], False, False, [], ["CPU"])
    b = determinism.TrainingRun(determinism.TrainingSetup("b"), "e", [1.0, 2.0], [], False, False, [], ["CPU"])
    with pytest.raises(ValueError, match="different models"):
        determinism.compare_runs(a, b)


def test_imports_do_not_load_tensorflow(fresh_python):
    out = fresh_python("import sys\nfrom gpucourse import determinism, latency, timing\n"
                       "print('tensorflow' in sys.modules)")
    assert out.strip() == "False"
