"""gpucourse.precision_hardware: Tensor Core support per compute capability, data-sheet peaks, TF32, advice."""

import pytest

from gpucourse import precision_hardware as hw

# (GPU, compute capability, float16, bfloat16, tfloat32, float8): NVIDIA's architecture documents
KNOWN = [
    ("T4", "7.5", True, False, False, False),  # Turing: Colab's free GPU, Kaggle's 2x T4
    ("V100", "7.0", True, False, False, False),  # Volta: the first Tensor Cores
    ("A100", "8.0", True, True, True, False),  # Ampere: bfloat16 and TF32
    ("L4", "8.9", True, True, True, True),  # Ada: FP8
    ("H100", "9.0", True, True, True, True),  # Hopper
    ("H100 PCIe", "9.0", True, True, True, True),  # the PCIe card: same Tensor Cores, lower clocks
    ("H200", "9.0", True, True, True, True),  # Hopper with HBM3e: the H100's compute peaks
]


@pytest.mark.parametrize("gpu, cc, fp16, bf16, tf32, fp8", KNOWN)
def test_tensor_core_support_of_known_gpus(gpu, cc, fp16, bf16, tf32, fp8):
    want = {"float16": fp16, "bfloat16": bf16, "tfloat32": tf32, "float8": fp8}
    assert hw.tensor_core_support(cc) == want
    assert hw.tensor_core_support(tuple(int(p) for p in cc.split("."))) == want
    assert list(hw.tensor_core_support(cc)) == list(hw.TENSOR_CORE_DTYPES)


@pytest.mark.parametrize("name, why", [
    ("NVIDIA GeForce GTX 1660 Ti", "TU116/TU117"), ("GeForce GTX 1650", "TU116/TU117"),
    ("NVIDIA GeForce GTX 1630", "GTX 16xx"), ("nvidia geforce gtx1660 super", "GTX 16xx"),
    ("NVIDIA GeForce MX450", "TU117"), ("NVIDIA GeForce MX550", "MX450/MX550"),
])
def test_turing_chips_without_tensor_cores_are_told_by_name(name, why):
    """Compute capability 7.5 covers the T4 and the GTX 16xx: only the name tells them apart."""
    assert why in hw.lacks_tensor_cores(name)
    assert hw.tensor_core_support("7.5", name) == dict.fromkeys(hw.TENSOR_CORE_DTYPES, False)
    advice = hw.recommend_policy("7.5", name)
    assert advice.policy == "float32" and "no Tensor Cores" in advice.reason


@pytest.mark.parametrize("name", [None, "Tesla T4", "NVIDIA GeForce RTX 2080 Ti", "NVIDIA GeForce GTX 1080",
                                  "NVIDIA GeForce RTX 4060", "Quadro RTX 4000", "NVIDIA GeForce MX250",
                                  "NVIDIA GeForce GTX 160"])
def test_names_with_tensor_cores_or_unknown_keep_the_compute_capability_answer(name):
    assert hw.lacks_tensor_cores(name) is None
    for cc in ("6.1", "7.5", "8.9"):
        assert hw.tensor_core_support(cc, name) == hw.tensor_core_support(cc)
    assert hw.recommend_policy("7.5", name) == hw.recommend_policy("7.5")


@pytest.mark.parametrize("bad, exc", [(16, TypeError), ("", ValueError), (b"GTX 1660", TypeError)])
def test_gpu_name_bad_input(bad, exc):
    with pytest.raises(exc, match="name"):
        hw.tensor_core_support("7.5", bad)


@pytest.mark.parametrize("cc, want", [("6.1", {}), ("8.6", {"float16", "bfloat16", "tfloat32"}),
                                      ("8.7", {"float16", "bfloat16", "tfloat32"}),
                                      ((10, 0), {"float16", "bfloat16", "tfloat32", "float8"}),
                                      ([12, 0], {"float16", "bfloat16", "tfloat32", "float8"})])
def test_tensor_core_support_boundaries(cc, want):
    assert {d for d, ok in hw.tensor_core_support(cc).items() if ok} == set(want)


@pytest.mark.parametrize("bad, exc", [("eight", ValueError), ("8", ValueError), ("8.6.1", ValueError),
                                      (8.6, TypeError), ((8,), TypeError), ((8.0, 6), TypeError),
                                      ((0, 1), ValueError), ((8, -1), ValueError), ((True, 0), TypeError)])
def test_compute_capability_bad_input(bad, exc):
    with pytest.raises(exc, match="compute capability"):
        hw.tensor_core_support(bad)


def test_data_sheet_peaks_agree_with_tensor_core_support():
    """A data-sheet peak is listed for a dtype exactly when that GPU has Tensor Cores for it."""
    assert set(hw.GPU_PEAKS) == {gpu for gpu, *_ in KNOWN}
    for gpu, cc, *_ in KNOWN:
        g = hw.GPU_PEAKS[gpu]
        assert "{}.{}".format(*g.cc) == cc and g.source.startswith("NVIDIA")
        for dtype, ok in hw.tensor_core_support(g.cc).items():
            assert (g.peak(dtype) is not None) == ok, (gpu, dtype)
        assert g.float32 > 0


def test_peak_speedup():
    # TF32 is the float32 baseline on Ampere and later: mixed precision's ceiling is about 2x there
    assert hw.peak_speedup("A100") == pytest.approx(2.0)
    assert hw.peak_speedup("H100") == pytest.approx(2.0, rel=0.01)
    assert hw.peak_speedup("a100", tf32=False) == pytest.approx(16.0)
    assert hw.peak_speedup("H100", "float8") == pytest.approx(4.0, rel=0.01)
    assert hw.peak_speedup("T4") == pytest.approx(65 / 8.1)  # no TF32: the baseline is plain float32
    assert hw.peak_speedup("T4", tf32=True) == hw.peak_speedup("T4", tf32=False)
    with pytest.raises(ValueError, match="no bfloat16 Tensor Cores"):
        hw.peak_speedup("T4", "bfloat16")
    with pytest.raises(ValueError, match="known: T4"):
        hw.peak_speedup("P100")
    with pytest.raises(ValueError, match="dtype"):
        hw.peak_speedup("A100", "float32")
    with pytest.raises(TypeError, match="tf32"):
        hw.peak_speedup("A100", tf32="yes")


def test_peak_table():
    text = hw.peak_table()
    lines = text.splitlines()
    assert lines[0].startswith("GPU") and len(lines) == 1 + len(hw.TABLE_GPUS)  # notebook 05's table
    t4 = next(line for line in lines if line.startswith("T4"))
    assert "float16 " in t4 and "bfloat16" not in t4 and "8.0x" in t4
    a100 = next(line for line in lines if line.startswith("A100"))
    assert "2.0x" in a100 and "16.0x" in a100
    assert len(hw.peak_table(["t4"]).splitlines()) == 2


def test_tf32_switch_is_read_from_tensorflow():
    import tensorflow as tf

    before = tf.config.experimental.tensor_float_32_execution_enabled()
    try:
        tf.config.experimental.enable_tensor_float_32_execution(False)
        assert hw.tf32_enabled() is False
        tf.config.experimental.enable_tensor_float_32_execution(True)
        assert hw.tf32_enabled() is True
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(before)


def test_recommend_policy():
    assert hw.recommend_policy(None).policy == "float32"
    assert hw.recommend_policy("6.1").policy == "float32"
    t4 = hw.recommend_policy("7.5")
    assert t4.policy == "mixed_float16" and "no bfloat16" in t4.reason
    advice = hw.recommend_policy((8, 6))
    assert advice.policy == "mixed_bfloat16" and "8.6" in str(advice) and "TF32" in advice.reason


def test_gpu_compute_capability_without_gpu():
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU")
    assert hw.gpu_compute_capability() is None
    with pytest.raises(ValueError, match="index"):
        hw.gpu_compute_capability(-1)
    with pytest.raises(TypeError, match="index"):
        hw.gpu_compute_capability("0")


@pytest.mark.gpu
def test_gpu_compute_capability_on_gpu():
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        pytest.skip("no GPU on this machine")
    cc = hw.gpu_compute_capability()
    assert isinstance(cc, tuple) and len(cc) == 2 and cc >= (3, 0)
    assert hw.recommend_policy(cc).policy in ("float32", "mixed_float16", "mixed_bfloat16")
    assert set(hw.tensor_core_support(cc)) == set(hw.TENSOR_CORE_DTYPES)


@pytest.mark.parametrize("name, key", [
    ("Tesla T4", "T4"), ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H200", "H200"),
    ("NVIDIA L4", "L4"), ("Tesla V100-SXM2-16GB", "V100"), ("Tesla V100-SXM2-32GB", "V100"),
    # every A100 has the same peaks (NVIDIA's A100 data sheet), whatever its memory and form factor
    ("NVIDIA A100-SXM4-40GB", "A100"), ("A100-SXM4-40GB", "A100"), ("NVIDIA A100-PCIE-40GB", "A100"),
    ("NVIDIA A100 80GB PCIe", "A100"), ("NVIDIA A100-SXM4-80GB", "A100"), ("A100-SXM-80GB", "A100"),
])
def test_driver_names_find_their_data_sheet(name, key):
    assert hw.find_gpu(name) is hw.GPU_PEAKS[key]
    row, why = hw.pick_variant(name, hw.GPU_PEAKS)
    assert row == key and f"data-sheet row {key!r}" in why


@pytest.mark.parametrize("name", ["NVIDIA L40S", "NVIDIA RTX A1000", "NVIDIA H1000", "NVIDIA GeForce RTX 4090",
                                  "NVIDIA GH200 480GB", "Tesla V100S-PCIE-32GB"])
def test_no_false_data_sheet_match(name):
    assert hw.find_gpu(name) is None
    assert hw.pick_variant(name, hw.GPU_PEAKS) == (None, f"no data-sheet row for {name!r}; known: "
                                                         f"{', '.join(hw.GPU_PEAKS)}")


@pytest.mark.parametrize("name, said, rows", [
    # the NVL cards have lower peaks than the SXM modules; their figures are not in the course
    ("NVIDIA H100 NVL", "NVL", "'H100', 'H100 PCIe'"), ("NVIDIA H100NVL", "NVL", "'H100', 'H100 PCIe'"),
    ("NVIDIA H200 NVL", "NVL", "'H200'"),
    # the V100 row is the SXM2 module's; the PCIe card is slower
    ("Tesla V100-PCIE-16GB", "16GB PCIe", "'V100'"),
])
def test_a_variant_without_a_row_never_falls_onto_another_variants_row(name, said, rows):
    assert hw.find_gpu(name) is None
    row, why = hw.pick_variant(name, hw.GPU_PEAKS)
    assert row is None and f"names a variant ({said})" in why and f"rows {rows} describes" in why


def test_the_longest_match_wins_and_a_name_without_variant_gets_the_chips_first_row():
    keys = ["A100 80GB SXM", "A100 80GB PCIe", "A100 40GB", "H100", "H100 PCIe"]
    assert hw.pick_variant("NVIDIA A100 80GB PCIe", keys)[0] == "A100 80GB PCIe"  # both stated beat one
    assert hw.pick_variant("NVIDIA A100-PCIE-40GB", keys)[0] == "A100 40GB"       # 40GB fits PCIe and SXM
    assert hw.pick_variant("A100", keys) == ("A100 80GB SXM", "'A100' -> data-sheet row 'A100 80GB SXM' "
                                                              "(the name states no variant: the first of the A100 rows)")
    assert hw.pick_variant("nvidia h100 pcie", keys)[0] == "H100 PCIe"  # case does not matter
    assert hw.pick_variant("NVIDIA H100 80GB HBM3", keys)[1].endswith("(no other H100 row fits: 'H100' is the "
                                                                      "SXM module)")
    with pytest.raises(TypeError, match="name"):
        hw.pick_variant(None, keys)
