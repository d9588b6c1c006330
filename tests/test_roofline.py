"""gpucourse.roofline: FLOP counts, shapes and dtypes swept, data sheets, Roof, bandwidth, cpu facts, benchmark rows."""

import pytest

from gpucourse import precision_hardware, roofline


def test_a_multiply_add_is_two_flops():
    assert roofline.matmul_flops(2, 3, 4) == 48
    assert roofline.matmul_flops(8192, 8192, 8192) == 2 * 8192 ** 3
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        roofline.matmul_flops(2, 3, 0)
    with pytest.raises(TypeError, match="m must be a whole number"):
        roofline.matmul_flops(2.0, 3, 4)


@pytest.mark.parametrize("cc, expected", [
    ((7, 5), ["float32", "float16"]),                                # T4: float16 Tensor Cores only
    ((8, 0), ["float32", "tfloat32", "float16", "bfloat16"]),        # A100
    ((9, 0), ["float32", "tfloat32", "float16", "bfloat16"]),        # H100, H200
    ((6, 1), ["float32"]),                                           # Pascal: no Tensor Cores
])
def test_each_gpu_measures_its_tensor_core_dtypes(cc, expected):
    assert roofline.device_dtypes("GPU", cc) == expected


def test_a_cpu_measures_float32_and_a_gpu_needs_its_compute_capability():
    assert roofline.device_dtypes("CPU") == ["float32"]
    with pytest.raises(ValueError, match="compute_capability is needed"):
        roofline.device_dtypes("GPU")
    with pytest.raises(ValueError, match="device_type must be one of"):
        roofline.device_dtypes("TPU")


def test_gpu_shapes_reach_sizes_where_arithmetic_dominates():
    gpu, cpu = roofline.default_shapes("GPU"), roofline.default_shapes("CPU")
    assert max(m * n * k for m, n, k in gpu) >= 8192 ** 3
    assert max(m * n * k for m, n, k in cpu) <= 1024 ** 3


def test_the_data_sheet_lookup_is_topic_05s():
    assert roofline.datasheet_gpu is precision_hardware.find_gpu  # one table, one name matcher


def test_table_states_the_fraction_of_the_data_sheet_and_why_one_is_missing():
    t4 = precision_hardware.GPU_PEAKS["T4"]
    rows = [roofline.MatmulResult("float16", "GPU:0", 32.5, (4096, 4096, 4096), {}),
            roofline.MatmulResult("bfloat16", "GPU:0", 4.0, (4096, 4096, 4096), {})]
    table = roofline.format_matmul_table(rows, t4)
    assert "| float16 | 32.5 | 4096x4096x4096 | 65 | 50% |" in table
    assert "no bfloat16 Tensor Cores" in table
    assert "no data sheet for this device" in roofline.format_matmul_table(rows[:1], None)


def test_a_real_cpu_sweep_keeps_the_best_shape_and_restores_the_tf32_switch():
    import tensorflow as tf

    before = tf.config.experimental.tensor_float_32_execution_enabled()
    r = roofline.measure_matmul("tfloat32", shapes=[(64, 64, 64), (128, 128, 128)], device="CPU:0", repeats=2)
    assert tf.config.experimental.tensor_float_32_execution_enabled() == before
    assert set(r.tflops_by_shape) == {(64, 64, 64), (128, 128, 128)}
    assert r.best_tflops == max(r.tflops_by_shape.values()) > 0
    assert r.tflops_by_shape[r.best_shape] == r.best_tflops
    with pytest.raises(ValueError, match=r"shapes must hold \(m, n, k\) triples"):
        roofline.measure_matmul("float32", shapes=[(64, 64)], device="CPU:0")
    with pytest.raises(ValueError, match="dtype must be one of"):
        roofline.measure_matmul("int8", device="CPU:0")


# --------------------------------------------------------------------------- the memory roof, Roof, data sheets


def test_roof_is_min_of_peak_and_intensity_times_bandwidth():
    a100 = roofline.datasheet_roof("A100")
    assert a100.peak("float32") == 19.5 and a100.bandwidth_gbs == 2039.0
    assert a100.ridge("float32") == pytest.approx(19.5e12 / 2039e9)
    assert a100.attainable(1.0, "float32") == pytest.approx(2.039)        # memory roof: 1 FLOP/byte x 2039 GB/s
    assert a100.attainable(1000.0, "bfloat16") == 312.0                  # compute roof
    assert a100.bound(9.0, "float32") == "memory" and a100.bound(10.0, "float32") == "compute"
    assert a100.bound(100.0, "bfloat16") == "memory"                     # the bf16 ridge is 153 FLOP/byte
    assert a100.seconds(312e12, 1.0, "bfloat16") == pytest.approx(1.0)
    assert a100.seconds(1.0, 2039e9, "bfloat16") == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"T4 has no 'bfloat16' roof; it has \['float16', 'float32'\]"):
        roofline.datasheet_roof("T4").peak("bfloat16")
    with pytest.raises(ValueError, match="intensity must be > 0"):
        a100.attainable(0.0, "float32")


@pytest.mark.parametrize("name, key, gbs", [
    ("Tesla T4", "T4", 320), ("NVIDIA L4", "L4", 300), ("Tesla V100-SXM2-16GB", "V100", 900),
    # NVIDIA's A100 data sheet: 40GB PCIe 1,555; 80GB PCIe 1,935; 40GB SXM 1,555; 80GB SXM 2,039 GB/s
    ("NVIDIA A100-SXM4-40GB", "A100 40GB", 1555), ("A100-SXM4-40GB", "A100 40GB", 1555),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB", 1555), ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 1935),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 2039), ("A100-SXM-80GB", "A100 80GB SXM", 2039),
    ("A100", "A100 80GB SXM", 2039),  # no variant named: the first A100 row, and the roof says which
    ("NVIDIA H100 80GB HBM3", "H100", 3350), ("NVIDIA H100 PCIe", "H100 PCIe", 2000), ("NVIDIA H200", "H200", 4800),
])
def test_every_driver_name_gets_its_variants_roof_and_the_roof_names_it(name, key, gbs):
    roof = roofline.datasheet_roof(name)
    assert roof.name == key and roof.bandwidth_gbs == gbs
    assert roof.source.count("data sheet") == 2  # one for the peaks, one for the bandwidth
    assert roof.peaks["float32"] > 0


def test_notebook_01s_a100_gets_the_40gb_ridge_not_the_80gb_sxms():
    """The name notebook 01 uses: 1,555 GB/s, so its float32 ridge is 12.5 FLOP/byte, not 9.6 (31% off)."""
    roof = roofline.datasheet_roof("NVIDIA A100-SXM4-40GB")
    assert roof.ridge("float32") == pytest.approx(12.54, abs=0.01)
    assert roofline.datasheet_roof("NVIDIA A100-SXM4-80GB").ridge("float32") == pytest.approx(9.56, abs=0.01)
    measured = roofline.Roof("this GPU", {"float32": 18.0}, 1400.0, "measured")
    assert "| memory GB/s | 1,400 | 1555 | 90% |" in roofline.format_roof(measured, roof)


def test_each_bandwidth_row_is_its_own_roof_with_the_same_chips_peaks():
    for key in roofline.GPU_BANDWIDTH:
        roof = roofline.datasheet_roof(key)
        assert roof.name == key and roof.bandwidth_gbs == roofline.GPU_BANDWIDTH[key][0]
        assert roof.peaks["float32"] == roofline.datasheet_gpu(key).float32
        assert key.split()[0] in roofline.datasheet_gpu(key).name  # the same chip


@pytest.mark.parametrize("name, said", [("NVIDIA H100 NVL", "NVL"), ("NVIDIA H100NVL", "NVL"),
                                        ("NVIDIA H200 NVL", "NVL"), ("Tesla V100-PCIE-16GB", "16GB PCIe")])
def test_a_variant_without_a_data_sheet_gets_no_roof_rather_than_anothers(name, said):
    with pytest.raises(ValueError, match=rf"no data sheet for GPU '{name}': .* names a variant \({said}\)"):
        roofline.datasheet_roof(name)


def test_an_h100_pcie_card_gets_its_own_slower_data_sheet():
    pcie = roofline.datasheet_roof("NVIDIA H100 PCIe")
    assert pcie.name == "H100 PCIe" and pcie.bandwidth_gbs == 2000.0 and pcie.peak("bfloat16") == 756.5
    assert roofline.datasheet_roof("NVIDIA H100 80GB HBM3").peak("bfloat16") == 989.5


def test_h200_is_found_by_its_driver_name_without_changing_notebook_05s_table():
    assert roofline.datasheet_gpu("NVIDIA H200").name == "H200"
    assert "H200" not in precision_hardware.peak_table()  # notebook 05's table stays as it is
    assert roofline.datasheet_roof("H200").peak("bfloat16") == roofline.datasheet_roof("H100").peak("bfloat16")
    with pytest.raises(ValueError, match="no data sheet for GPU 'NVIDIA GeForce RTX 4090'"):
        roofline.datasheet_roof("NVIDIA GeForce RTX 4090")


def test_warm_up_runs_for_a_fixed_time_not_a_fixed_count():
    now = [0.0]
    calls = []

    def fn():
        calls.append(now[0])
        now[0] += 0.3  # each call takes 0.3 s of the fake clock
        return None

    assert roofline.warm_up(fn, 1.0, clock=lambda: now[0]) == 4 == len(calls)  # 0.3, 0.6, 0.9, 1.2 s
    now[0], calls[:] = 0.0, []
    assert roofline.warm_up(fn, 0.0, clock=lambda: now[0]) == 1  # always at least once
    with pytest.raises(ValueError, match="seconds must be >= 0"):
        roofline.warm_up(fn, -1.0)
    assert roofline.WARMUP_S["GPU"] >= 1.0


def test_a_real_sweep_warms_up_for_its_time_and_keeps_each_shapes_best_call(monkeypatch):
    import time as _time

    from gpucourse import timing

    spent = []
    real = roofline.warm_up
    monkeypatch.setattr(roofline, "warm_up", lambda fn, s, clock=None: spent.append(s) or real(fn, s))
    seen = {}
    real_time_fn = timing.time_fn

    def time_fn(*args, **kwargs):
        t = real_time_fn(*args, **kwargs)
        seen[kwargs["name"]] = t
        return t

    monkeypatch.setattr(timing, "time_fn", time_fn)
    t0 = _time.perf_counter()
    r = roofline.measure_matmul("float32", shapes=[(64, 64, 64)], device="CPU:0", repeats=3, warmup_s=0.2)
    assert _time.perf_counter() - t0 >= 0.2 and spent == [0.2]
    assert r.best_tflops == pytest.approx(2 * 64 ** 3 * 2 / seen["64x64x64"].min_s / 1e12)  # the best call
    spent.clear()
    roofline.measure_matmul("float32", shapes=[(64, 64, 64)], device="CPU:0", repeats=1, warmup_s=0)
    assert spent == []


def test_the_cpu_bandwidth_array_is_sized_from_the_cache_the_os_reports(tmp_path):
    for index, (level, size) in enumerate([(1, "48K"), (1, "64K"), (2, "2048K"), (3, "491520K")]):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
        (tmp_path / f"index{index}" / "level").write_text(f"{level}\n")
    assert roofline.read_cache_size(str(tmp_path)) == 491520 << 10  # the largest: a 480 MiB L3
    assert roofline.bandwidth_mib("CPU", 491520 << 10) == 1920  # 4x the L3: every pass comes from memory
    assert roofline.bandwidth_mib("CPU", 32 << 20) == 128
    assert roofline.bandwidth_mib("CPU", 1 << 20) == 64  # never below 64 MiB
    assert roofline.bandwidth_mib("CPU", None) == 64 and roofline.bandwidth_mib("GPU") == 1024
    (tmp_path / "index3" / "size").write_text("32M\n")
    assert roofline.read_cache_size(str(tmp_path)) == 32 << 20
    assert roofline.read_cache_size(str(tmp_path / "none")) is None  # off Linux: nothing reported
    (tmp_path / "index9").mkdir()
    (tmp_path / "index9" / "size").write_text("unknown\n")
    assert roofline.read_cache_size(str(tmp_path)) == 32 << 20  # an unreadable entry is skipped
    with pytest.raises(ValueError, match="cache_bytes must be >= 1"):
        roofline.bandwidth_mib("CPU", 0)
    with pytest.raises(ValueError, match="device_type must be one of"):
        roofline.bandwidth_mib("TPU")


X86 = "processor\t: 0\nmodel name\t: Intel Xeon\ncpu MHz\t\t: 2200.000\nflags\t\t: sse2 avx avx2 fma\n\n" \
      "processor\t: 1\nmodel name\t: Intel Xeon\ncpu MHz\t\t: 2200.000\nflags\t\t: sse2 avx avx2 fma\n"


def _smt(sockets, cores, threads):
    """/proc/cpuinfo of ``sockets`` x ``cores`` x ``threads`` (SMT siblings share a core id), as Linux lists it."""
    blocks, n = [], 0
    for thread in range(threads):
        for socket in range(sockets):
            for core in range(cores):
                blocks.append(f"processor\t: {n}\nmodel name\t: Xeon\nphysical id\t: {socket}\n"
                              f"siblings\t: {cores * threads}\ncore id\t\t: {core}\ncpu cores\t: {cores}\n"
                              "cpu MHz\t\t: 3000.000\nflags\t\t: avx2 fma avx512f\n")
                n += 1
    return "\n".join(blocks)


@pytest.mark.parametrize("text, vector, cores, physical, mhz", [
    (X86, 256, 2, None, 2200.0),  # no topology lines (some VMs): physical cores unknown
    (X86.replace("avx2 fma", "avx2 fma avx512f"), 512, 2, None, 2200.0),
    ("processor\t: 0\nFeatures\t: fp asimd evtstrm\nCPU part\t: 0xd0c\n", 128, 1, None, None),  # ARM: no MHz line
    (_smt(1, 4, 2), 512, 8, 4, 3000.0),  # hyper-threading: 8 logical, 4 physical cores
    (_smt(2, 4, 2), 512, 16, 8, 3000.0),  # two sockets: core ids repeat per socket
    (_smt(1, 2, 1), 512, 2, 2, 3000.0),
])
def test_cpu_facts_read_physical_cores_clock_and_vector_width(text, vector, cores, physical, mhz):
    facts = roofline.cpu_facts(text)
    assert (facts["vector_bits"], facts["logical_cores"], facts["physical_cores"], facts["mhz"]) == \
        (vector, cores, physical, mhz)
    # the vendor publishes FLOP per cycle per core; cpuinfo names neither the FMA units nor the all-core clock
    assert "physical cores x clock x FLOP per cycle per core" in facts["datasheet"]
    assert "vendor publishes" in facts["datasheet"] and "measured matmul peak" in facts["datasheet"]


def test_a_real_bandwidth_measurement_and_the_measured_roof(monkeypatch):
    sized = []
    monkeypatch.setattr(roofline, "read_cache_size", lambda: sized.append(1) or (1 << 20))
    assert roofline.measure_bandwidth(device="CPU:0", repeats=1).nbytes == 64 << 20 and sized == [1]
    bw = roofline.measure_bandwidth(device="CPU:0", mib=4, repeats=1, iters=1)
    assert bw.nbytes == 4 << 20 and bw.copy_gbs > 0 and bw.read_gbs > 0 and bw.best_gbs == max(bw.copy_gbs, bw.read_gbs)
    mm = roofline.MatmulResult("float32", "CPU:0", 0.1, (64, 64, 64), {})
    roof = roofline.measured_roof([mm], bw)
    assert roof.peaks == {"float32": 0.1} and roof.bandwidth_gbs == bw.best_gbs and roof.source.startswith("measured")
    with pytest.raises(TypeError, match="bandwidth must be a BandwidthResult"):
        roofline.measured_roof([mm], 5.0)
    with pytest.raises(ValueError, match="matmuls must be a non-empty list"):
        roofline.measured_roof([], bw)
    with pytest.raises(TypeError, match="matmuls must be a non-empty list of MatmulResult"):
        roofline.measured_roof([bw], bw)
    with pytest.raises(ValueError, match="mib must be >= 1"):
        roofline.measure_bandwidth(device="CPU:0", mib=0)


def test_format_roof_puts_the_measured_roof_beside_the_data_sheet():
    sheet = roofline.datasheet_roof("A100")
    measured = roofline.Roof("this GPU", {"float32": 18.0, "bfloat16": 250.0}, 1800.0, "measured")
    table = roofline.format_roof(measured, sheet)
    assert "| float32 TFLOP/s | 18 | 19.5 | 92% |" in table
    assert "| bfloat16 TFLOP/s | 250 | 312 | 80% |" in table
    assert "| memory GB/s | 1,800 | 2039 | 88% |" in table
    assert "ridge (bfloat16)" in roofline.format_roof(measured)
    with pytest.raises(TypeError, match="roof and reference must be Roof"):
        roofline.format_roof(measured, "A100")


class _FakeConfig:
    def __init__(self, gpus, name):
        self._gpus, self._name = gpus, name
        self.experimental = self

    def list_physical_devices(self, kind):
        return self._gpus

    def get_device_details(self, gpu):
        return {"device_name": self._name}


def _fake_roof(monkeypatch, gpus, name, dtype_rates, gbs):
    import types

    monkeypatch.setattr(roofline, "_tf", lambda: types.SimpleNamespace(config=_FakeConfig(gpus, name)))
    mms = [roofline.MatmulResult(d, "GPU:0" if gpus else "CPU:0", r, (4096, 4096, 4096), {}) for d, r in dtype_rates]
    bw = roofline.BandwidthResult("GPU:0" if gpus else "CPU:0", 1 << 30, gbs, gbs * 0.9)
    monkeypatch.setattr(roofline, "measure_roof", lambda quick=False: (roofline.measured_roof(mms, bw), mms, bw))


def test_benchmark_rows_on_a_gpu_are_measured_over_the_data_sheet(monkeypatch):
    from gpucourse import benchmark

    _fake_roof(monkeypatch, ["gpu0"], "NVIDIA H100 80GB HBM3", [("float32", 50.0), ("bfloat16", 700.0)], 2680.0)
    rows = roofline.benchmark(quick=True)
    assert all(set(benchmark.REQUIRED_KEYS) <= set(r) for r in rows)
    bf16 = next(r for r in rows if "bfloat16" in r["case"])
    assert bf16["ratio_to_bound"] == pytest.approx(989.5 / 700.0)  # measured time over the data sheet's time
    assert "700 TFLOP/s of 989.5" in bf16["note"]
    memory = rows[-1]
    assert memory["ratio_to_bound"] == pytest.approx(3350 / 2680.0) and "2.68e+03 GB/s" in memory["note"]


def test_benchmark_rows_on_a_cpu_have_no_bound(monkeypatch):
    _fake_roof(monkeypatch, [], "", [("float32", 0.1)], 10.0)
    rows = roofline.benchmark(quick=True)
    assert [r["bound_s"] for r in rows] == [None, None] and "measured roof only" in rows[0]["note"]
    assert rows[0]["median_s"] == pytest.approx(2 * 4096 ** 3 / 0.1e12)


def test_benchmark_rows_on_an_a100_40gb_use_its_variants_bandwidth_and_name_the_row(monkeypatch):
    _fake_roof(monkeypatch, ["gpu0"], "NVIDIA A100-SXM4-40GB", [("bfloat16", 250.0)], 1400.0)
    rows = roofline.benchmark(quick=True)
    assert rows[-1]["ratio_to_bound"] == pytest.approx(1555 / 1400.0) and "of 1555" in rows[-1]["note"]
    assert "data-sheet row A100 40GB" in rows[0]["note"]
    _fake_roof(monkeypatch, ["gpu0"], "NVIDIA H100 NVL", [("bfloat16", 700.0)], 3000.0)
    assert [r["bound_s"] for r in roofline.benchmark(quick=True)] == [None, None]  # not the SXM module's
