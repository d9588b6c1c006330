"""gpucourse.roofline: FLOP counts, the shapes and dtypes swept per device, data-sheet lookup, a real CPU sweep."""

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


@pytest.mark.parametrize("name, key", [
    ("Tesla T4", "T4"), ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA L4", "L4"), ("Tesla V100-SXM2-16GB", "V100"),
])
def test_driver_names_find_their_data_sheet(name, key):
    assert roofline.datasheet_gpu(name) is precision_hardware.GPU_PEAKS[key]


def test_an_unknown_gpu_has_no_data_sheet_and_no_false_match():
    assert roofline.datasheet_gpu("NVIDIA GeForce RTX 4090") is None
    assert roofline.datasheet_gpu("NVIDIA H1000") is None  # 'H100' is a word, not a substring


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
