"""`make test-cpu-paths` (.ci/cpu_paths.py): probes decide which tutorial runs on which CPU code path.

The plan is tested with faked probes for four CPU classes. The fakes follow TensorFlow's own rule for handing
16-bit ops to oneDNN (tensorflow/core/util/util.cc, IsDataTypeSupportedByOneDNNOnThisCPU: bfloat16 on any CPU
with AVX512F, float16 with AVX512BW plus AVX512_FP16 or AMX_FP16), which looks at the CPU's real features and
not at ONEDNN_MAX_CPU_ISA; oneDNN then fails when the cap leaves it no kernel for the dtype. For the class
of the machine CI failed on (AVX-512 with FP16 and AMX), the fake is what the real probes found there, and
the rule is checked against it.
"""

import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _load():
    spec = importlib.util.spec_from_file_location("cpu_paths", ROOT / ".ci" / "cpu_paths.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["cpu_paths"] = module  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


cp = _load()

#: oneDNN's ISA names, each including the ones before it (ONEDNN_MAX_CPU_ISA caps the list).
LADDER = ["SSE41", "AVX", "AVX2", "AVX512_CORE", "AVX512_CORE_VNNI", "AVX512_CORE_BF16", "AVX512_CORE_FP16",
          "AVX512_CORE_AMX"]


@dataclass
class FakeCPU:
    name: str
    top: str  # the best ISA oneDNN finds on this CPU
    flags: frozenset  # what TensorFlow's dispatch rule reads
    openblas: str  # OpenBLAS's own choice of kernels


AVX2_ONLY = FakeCPU("AVX2 only (Haswell to Comet Lake)", "AVX2", frozenset({"avx2"}), "Haswell")
AVX512 = FakeCPU("AVX-512 (Skylake-SP, Cascade Lake)", "AVX512_CORE_VNNI",
                 frozenset({"avx2", "avx512f", "avx512bw", "avx512_vnni"}), "SkylakeX")
AVX512_BF16 = FakeCPU("AVX-512 with BF16 (Cooper Lake, Zen 4)", "AVX512_CORE_BF16",
                      frozenset({"avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"}), "Cooperlake")
AVX512_FP16_AMX = FakeCPU("AVX-512 with FP16 and AMX (Sapphire Rapids and later)", "AVX512_CORE_AMX",
                          frozenset({"avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
                                     "amx_bf16", "amx_int8", "amx_tile"}), "SkylakeX")
CLASSES = [AVX2_ONLY, AVX512, AVX512_BF16, AVX512_FP16_AMX]


def _isa(cpu: FakeCPU, env) -> str:
    cap = env.get("ONEDNN_MAX_CPU_ISA", cpu.top)
    return LADDER[min(LADDER.index(cap), LADDER.index(cpu.top))]  # a cap above the CPU changes nothing


def _onednn(env) -> bool:
    return env.get("TF_ENABLE_ONEDNN_OPTS", "1") not in ("0", "false")


def model_outcome(cpu: FakeCPU, env, check: str, allocator_without_onednn: bool = True):
    """What the check does on ``cpu`` under ``env``, by TensorFlow's dispatch rule and oneDNN's ISA needs."""
    onednn, isa = _onednn(env), LADDER.index(_isa(cpu, env))
    if check == "allocator statistics":
        ok = onednn or allocator_without_onednn  # the course's setup turns on the BFC allocator without oneDNN
        return cp.Outcome(ok, "" if ok else "tf.config.experimental.get_memory_info('CPU:0') after a matmul raised "
                                            "ValueError: Allocator stats not available for device 'CPU:0'")
    to_onednn = onednn and {"float32": True, "bfloat16": "avx512f" in cpu.flags,
                            "float16": "avx512bw" in cpu.flags and bool({"avx512_fp16", "amx_fp16"} & cpu.flags)}[check]
    needed = {"float32": "SSE41", "bfloat16": "AVX512_CORE", "float16": "AVX512_CORE_FP16"}[check]
    if to_onednn and isa < LADDER.index(needed):
        return cp.Outcome(False, f"{check} matmul: the process died of SIGSEGV")
    return cp.Outcome(True)


class FakeProbes:
    """The probe and signature functions of cpu_paths, answered for one fake CPU; records what was asked."""

    def __init__(self, cpu: FakeCPU, allocator_without_onednn: bool = True):
        self.cpu, self.allocator_without_onednn, self.probed = cpu, allocator_without_onednn, []

    def signature(self, path):
        env = path.env if path else {}
        return {"oneDNN": _onednn(env), "oneDNN ISA": _isa(self.cpu, env),
                "OpenBLAS": env.get("OPENBLAS_CORETYPE", self.cpu.openblas)}

    def probe(self, path, checks):
        self.probed.append(path)
        return {c: model_outcome(self.cpu, path.env, c, self.allocator_without_onednn) for c in checks}


#: What the real probes found on the AVX-512 FP16/AMX Xeon (family 6, model 207) with TensorFlow 2.21.0, in CI's
#: environment (TF_ENABLE_ONEDNN_OPTS=1): `python .ci/cpu_paths.py --list` on 2026-11-28, with the errors of
#: each 16-bit step run alone (a float16 softmax raises AbortedError, a mixed_float16 training step aborts).
MEASURED_ISA = ("Intel AVX-512 with float16, Intel DL Boost and bfloat16 support and Intel AMX with bfloat16 and "
                "8-bit integer support")
MEASURED = {
    None: {"oneDNN": True, "oneDNN ISA": MEASURED_ISA, "OpenBLAS": "SkylakeX"},
    cp.AVX2: ({"oneDNN": True, "oneDNN ISA": "Intel AVX2", "OpenBLAS": "Haswell"},
              {"float32": cp.Outcome(True), "float16": cp.Outcome(False, "float16 matmul: the process died of SIGSEGV"),
               "bfloat16": cp.Outcome(False, "bfloat16 matmul: the process died of SIGSEGV"),
               "allocator statistics": cp.Outcome(True)}),
    cp.AVX512: ({"oneDNN": True, "oneDNN ISA": "Intel AVX-512 with AVX512BW, AVX512VL, and AVX512DQ extensions",
                 "OpenBLAS": "Haswell"},
                {"float32": cp.Outcome(True), "float16": cp.Outcome(False, "float16 matmul: the process died of SIGSEGV"),
                 "bfloat16": cp.Outcome(True), "allocator statistics": cp.Outcome(True)}),
    cp.ONEDNN_OFF: ({"oneDNN": False, "oneDNN ISA": MEASURED_ISA, "OpenBLAS": "SkylakeX"},
                    {c: cp.Outcome(True) for c in cp.STEPS}),
}
#: The same machine, each 16-bit step alone (the probe stops at a check's first failing step).
MEASURED_STEPS = {
    "float16 softmax": "AbortedError: ... could not create a primitive descriptor for the softmax forward "
                       "propagation primitive ... mkl_softmax_op.cc",
    "Dense training step under mixed_float16": "SIGABRT: terminate called after throwing an instance of "
                                               "'dnnl::error' what(): could not create a primitive descriptor for "
                                               "the inner product forward propagation primitive",
}


class MeasuredProbes(FakeProbes):
    def __init__(self):
        super().__init__(AVX512_FP16_AMX)

    def signature(self, path):
        return MEASURED[None] if path is None else MEASURED[path][0]

    def probe(self, path, checks):
        self.probed.append(path)
        return {c: MEASURED[path][1][c] for c in checks}


def _plan(probes):
    default, surveys = cp.survey(cp.PATHS, NOTEBOOKS, probe=probes.probe, signature=probes.signature)
    return cp.plan(NOTEBOOKS, default, surveys)


def _runs(steps):
    return {s.path: {nb.name[:2] for nb in s.run} for s in steps}


def test_the_fake_of_this_cpu_class_follows_tensorflows_rule():
    """The rule behind the other three fakes predicts what the real probes found on the FP16/AMX Xeon."""
    for path in cp.PATHS:
        sig, outcomes = MEASURED[path]
        for check, outcome in outcomes.items():
            assert model_outcome(AVX512_FP16_AMX, path.env, check).ok == outcome.ok, (path.name, check)
        assert sig["oneDNN"] == _onednn(path.env)


@pytest.mark.parametrize("probes", [FakeProbes(c) for c in CLASSES[:3]] + [MeasuredProbes()],
                         ids=[c.name for c in CLASSES])
def test_every_tutorial_with_checked_cells_runs_on_a_path_other_than_the_default(probes):
    steps = _plan(probes)
    assert cp.uncovered(NOTEBOOKS, steps) == []
    assert all(cp.checked(nb) for nb in NOTEBOOKS), "every tutorial has checked cells: the coverage covers them all"
    for s in steps:
        left = {nb for nb, _ in s.left_out}
        assert set(s.run) | left == (set() if s.skipped else set(NOTEBOOKS)), "every tutorial is run or named"
        assert not set(s.run) & left
        for nb, why in s.left_out:
            assert "on this path" in why and len(why) > 40, why


def test_an_avx2_only_cpu_runs_only_the_path_with_onednn_off():
    """Capping oneDNN at AVX2 or AVX512_CORE changes nothing on an AVX2 CPU: those paths are skipped, unprobed."""
    probes = FakeProbes(AVX2_ONLY)
    steps = {s.path: s for s in _plan(probes)}
    for path in (cp.AVX2, cp.AVX512):
        assert steps[path].skipped.startswith("it selects the same code as the default on this CPU"), steps[path]
        assert "AVX2" in steps[path].skipped and "Haswell" in steps[path].skipped
        assert not steps[path].run
    assert probes.probed == [cp.ONEDNN_OFF]
    assert {nb.name[:2] for nb in steps[cp.ONEDNN_OFF].run} == {nb.name[:2] for nb in NOTEBOOKS}


def test_avx512_cpus_leave_the_bfloat16_tutorial_out_of_the_avx2_path_only():
    for cpu in (AVX512, AVX512_BF16):
        runs = _runs(_plan(FakeProbes(cpu)))
        everything = {nb.name[:2] for nb in NOTEBOOKS}
        assert runs[cp.AVX2] == everything - {"05"}, cpu.name
        assert runs[cp.AVX512] == everything, cpu.name  # a distinct path there: another ISA or other OpenBLAS kernels
        assert runs[cp.ONEDNN_OFF] == everything, cpu.name


def test_on_the_fp16_amx_xeon_the_float16_tutorial_runs_with_onednn_off_only():
    """The CI failure: 05's float16 softmax aborted with oneDNN capped at AVX512_CORE. Now the probe says why."""
    steps = {s.path: s for s in _plan(MeasuredProbes())}
    runs = _runs(steps.values())
    everything = {nb.name[:2] for nb in NOTEBOOKS}
    assert runs[cp.AVX2] == runs[cp.AVX512] == everything - {"05"}
    assert runs[cp.ONEDNN_OFF] == everything
    (nb, why), = steps[cp.AVX512].left_out
    assert nb.name.startswith("05") and "float16" in why and "SIGSEGV" in why and "bfloat16" not in why, why
    (nb, why), = steps[cp.AVX2].left_out
    assert "float16 matmul" in why and "bfloat16 matmul" in why, why
    assert "03" in runs[cp.ONEDNN_OFF], "the allocator statistics hold without oneDNN (the BFC CPU allocator)"


def test_a_tutorial_that_no_path_can_run_is_reported():
    """Without the course's BFC fallback, an AVX2-only CPU has no path left for 03: the run fails and says so."""
    probes = FakeProbes(AVX2_ONLY, allocator_without_onednn=False)
    steps = _plan(probes)
    assert [nb.name[:2] for nb in cp.uncovered(NOTEBOOKS, steps)] == ["03"]
    off = next(s for s in steps if s.path is cp.ONEDNN_OFF)
    (nb, why), = off.left_out
    assert "allocator statistics" in why and "Allocator stats not available" in why
    text = cp.describe(steps)
    assert "left out 03: it measures CPU memory" in text and "skipped: it selects the same code" in text


def test_an_unknown_signature_is_never_taken_for_the_default():
    probes = FakeProbes(AVX2_ONLY)
    default, surveys = cp.survey(cp.PATHS, NOTEBOOKS, probe=probes.probe, signature=lambda path: None)
    assert default is None and probes.probed == list(cp.PATHS)
    assert not any(s.skipped for s in cp.plan(NOTEBOOKS, default, surveys))


def test_what_each_tutorial_needs_matches_what_its_code_names():
    """A tutorial that starts computing in float16 or bfloat16, or measuring CPU memory, must say so in NEEDS."""
    for nb in NOTEBOOKS:
        code = "\n".join(c.source for c in nbformat.read(nb, as_version=4).cells if c.cell_type == "code")
        key = nb.name[:2]
        for check, pattern in cp.MENTIONS.items():
            named = bool(re.search(pattern, code))
            declared = check in cp.NEEDS.get(key, {}) or (key, check) in cp.NOT_NEEDED
            assert named == declared, (f"{nb.name}: its code {'names' if named else 'does not name'} {check}; "
                                       f"put it in NEEDS or NOT_NEEDED of .ci/cpu_paths.py" if named else
                                       f"{nb.name}: NEEDS or NOT_NEEDED names {check}, which its code does not")
    assert set(cp.needs(ROOT / "notebooks" / "05_x.ipynb")) == {"float32", "float16", "bfloat16"}
    assert set(cp.needs(ROOT / "notebooks" / "01_x.ipynb")) == {"float32"}
    assert set(cp.STEPS) == {"float32", "float16", "bfloat16", "allocator statistics"}
    assert all(check in cp.STEPS for need in cp.NEEDS.values() for check in need)


# ------------------------------------------------------------------ the probe itself, on real processes

STANDIN = r'''
import json, os, signal, sys, time
def say(kind, check, text=""):
    print(%r + json.dumps([kind, check, text]), flush=True)
say("begin", "start", "start"); say("ok", "start")
for check in sys.argv[2:]:
    say("begin", check, check + " step")
    if check == "float16":
        os.kill(os.getpid(), signal.SIGSEGV)
    if check == "bfloat16":
        time.sleep(60)
    if check == "allocator statistics":
        say("error", check, "allocator step raised ValueError: Allocator stats not available")
        continue
    say("ok", check)
''' % cp.PROBE_TAG


def test_the_probe_survives_a_crash_and_a_hang_and_goes_on_in_a_fresh_process(monkeypatch):
    monkeypatch.setattr(cp, "_PROBE_CODE", STANDIN)
    found = cp.probe(cp.AVX2, ["float16", "float32", "bfloat16", "allocator statistics"], step_limit_s=3)
    assert found["float16"] == cp.Outcome(False, "float16 step: the process died of SIGSEGV")
    assert found["float32"] == cp.Outcome(True)
    assert found["bfloat16"] == cp.Outcome(False, "bfloat16 step: did not finish within 3 s")
    assert found["allocator statistics"].ok is False and "Allocator stats" in found["allocator statistics"].detail


def test_a_probe_that_cannot_start_fails_every_check(monkeypatch):
    monkeypatch.setattr(cp, "_PROBE_CODE", "import sys; sys.exit(3)")
    found = cp.probe(cp.AVX2, ["float32", "float16"], start_limit_s=30)
    assert set(found) == {"float32", "float16"}
    assert all(not o.ok and "exited with code 3" in o.detail for o in found.values()), found


def test_the_plan_comes_from_probes_not_from_lists_of_cpus():
    source = (ROOT / ".ci" / "cpu_paths.py").read_text()
    assert "/proc/cpuinfo" not in source and "has_avx512" not in source
    assert not hasattr(cp, "BFLOAT16")
    assert "$(PY) .ci/cpu_paths.py --jobs $(JOBS)" in (ROOT / "Makefile").read_text()
