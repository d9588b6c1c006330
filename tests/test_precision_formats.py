"""gpucourse.precision_formats: number formats, casts, TF32 rounding (against exact bit patterns), emulated matmuls."""

import math

import numpy as np
import pytest

from gpucourse import precision_formats as pf


def _bits(x) -> int:
    return int(np.asarray(x, np.float32).view(np.uint32))


def _f32(bits: int) -> np.float32:
    return np.array([bits], np.uint32).view(np.float32)[0]


# --------------------------------------------------------------------------- formats


def test_float_formats():
    f16, bf16, f32, tf32 = (pf.float_format(d) for d in ("float16", "bfloat16", "float32", "tfloat32"))
    assert (f16.bits, f16.exponent_bits, f16.mantissa_bits) == (16, 5, 10)
    assert f16.max == 65504.0 and f16.smallest_subnormal == 2.0 ** -24 and f16.smallest_normal == 2.0 ** -14
    assert (bf16.bits, bf16.exponent_bits, bf16.mantissa_bits) == (16, 8, 7)
    assert bf16.smallest_normal == f32.smallest_normal and bf16.eps == 2.0 ** -7
    # TF32: float32's exponent (range), float16's mantissa (precision)
    assert (tf32.bits, tf32.exponent_bits, tf32.mantissa_bits) == (19, 8, 10)
    assert tf32.eps == f16.eps and tf32.smallest_normal == f32.smallest_normal
    assert tf32.max == float(pf.round_to_tf32(_f32(0x7F7FE000)))  # the largest float32 with 13 zero low bits
    assert 3 < f16.decimal_digits < 3.5 and "float16" in str(f16)
    e4m3, e5m2 = pf.float_format("float8_e4m3fn"), pf.float_format("float8_e5m2")
    assert (e4m3.max, e4m3.mantissa_bits, e5m2.max, e5m2.mantissa_bits) == (448.0, 3, 57344.0, 2)
    table = pf.format_table()
    assert table.splitlines()[0].startswith("format") and len(table.splitlines()) == 5
    assert "65504" in table  # the exact float16 maximum, not a rounded 6.55e+04


@pytest.mark.parametrize("bad, exc", [("float8", ValueError), ("int32", ValueError), (16, TypeError)])
def test_float_format_bad_input(bad, exc):
    with pytest.raises(exc, match="float16|dtype"):
        pf.float_format(bad)


@pytest.mark.parametrize("bad, exc", [("float16", TypeError), ([], TypeError), (["fp16"], ValueError)])
def test_format_table_bad_input(bad, exc):
    with pytest.raises(exc, match="dtype|format"):
        pf.format_table(bad)


@pytest.mark.parametrize("value, dtype, outcome, result", [
    (70000, "float16", "overflow", math.inf),
    (-70000, "float16", "overflow", -math.inf),
    (65519, "float16", "rounded", 65504.0),
    (65520, "float16", "overflow", math.inf),
    (65504, "float16", "exact", 65504.0),
    (1e-8, "float16", "underflow", 0.0),
    (3e-5, "float16", "subnormal", None),
    (1e-8, "bfloat16", "rounded", None),
    (1.001, "bfloat16", "rounded", 1.0),
    (0.5, "bfloat16", "exact", 0.5),
    (0.0, "float16", "exact", 0.0),
    (1.0001, "tfloat32", "rounded", 1.0),
    (1 + 2.0 ** -10, "tfloat32", "exact", 1 + 2.0 ** -10),
    (70000, "tfloat32", "rounded", 70016.0),
    (1e-8, "tfloat32", "rounded", None),  # float32's range: no underflow
    (500, "float8_e4m3fn", "overflow", None),  # e4m3fn has no inf: NaN
])
def test_classify_cast(value, dtype, outcome, result):
    r = pf.classify_cast(value, dtype)
    assert r.outcome == outcome
    if result is not None:
        assert r.result == result
    if outcome == "underflow":
        assert r.relative_error == 1.0


@pytest.mark.parametrize("bad, exc", [(float("nan"), ValueError), (float("inf"), ValueError),
                                      ("1.0", TypeError), (True, TypeError)])
def test_classify_cast_bad_input(bad, exc):
    with pytest.raises(exc, match="value"):
        pf.classify_cast(bad, "float16")


def test_cast_table():
    text = pf.cast_table([70000, 1e-8], ["float16", "bfloat16", "tfloat32"])
    assert "inf (overflow)" in text and "0 (underflow)" in text and "70144 (rounded)" in text
    assert "70016 (rounded)" in text
    with pytest.raises(ValueError, match="empty"):
        pf.cast_table([])
    with pytest.raises(TypeError, match="dtypes"):
        pf.cast_table([1.0], "float16")


# --------------------------------------------------------------------------- TF32 rounding, bit by bit


@pytest.mark.parametrize("bits_in, nearest, truncate", [
    (0x3F800000, 0x3F800000, 0x3F800000),  # 1.0 is exact
    (0x3F800347, 0x3F800000, 0x3F800000),  # 1.0001 -> 1.0 (TensorFlow's documented example)
    (0x3F802000, 0x3F802000, 0x3F802000),  # 1 + 2^-10: exact
    (0x3F801000, 0x3F800000, 0x3F800000),  # 1 + 2^-11: a tie, to the even neighbour (down)
    (0x3F803000, 0x3F804000, 0x3F802000),  # 1 + 3*2^-11: a tie, to the even neighbour (up)
    (0x3F801001, 0x3F802000, 0x3F800000),  # just above the tie: up; truncation drops it
    (0x3F801FFF, 0x3F802000, 0x3F800000),
    (0xBF800347, 0xBF800000, 0xBF800000),  # the sign is kept
    (0x3FFFF000, 0x40000000, 0x3FFFE000),  # rounding up carries into the exponent: 2.0
    (0x7F7FFFFF, 0x7F800000, 0x7F7FE000),  # the largest float32 rounds to inf (nearest)
    (0x00001FFF, 0x00002000, 0x00000000),  # subnormals too
    (0x7F800000, 0x7F800000, 0x7F800000),  # inf stays inf
    (0xFF800000, 0xFF800000, 0xFF800000),  # -inf
])
def test_round_to_tf32_bit_patterns(bits_in, nearest, truncate):
    x = _f32(bits_in)
    assert _bits(pf.round_to_tf32(x)) == nearest
    assert _bits(pf.round_to_tf32(x, "truncate")) == truncate
    assert _bits(pf.round_to_tf32(x, "nearest")) & 0x1FFF == 0 or not np.isfinite(x)


def test_round_to_tf32_arrays_and_nan():
    x = np.array([1.0001, np.nan, -2.5, 3e-39], np.float32)
    before = x.copy()
    out = pf.round_to_tf32(x)
    assert out.dtype == np.float32 and out.shape == (4,)
    assert np.isnan(out[1]) and out[0] == 1.0 and out[2] == -2.5
    np.testing.assert_array_equal(x, before)  # the input is never modified
    nan_low_bits = _f32(0x7F800001)  # a NaN whose payload lies only in the dropped bits stays NaN
    assert np.isnan(pf.round_to_tf32(nan_low_bits)) and np.isnan(pf.round_to_tf32(nan_low_bits, "truncate"))
    rng = np.random.default_rng(0)
    v = rng.normal(size=10_000).astype(np.float32)
    rel = np.abs(pf.round_to_tf32(v).astype(np.float64) - v) / np.abs(v)
    assert rel.max() <= 2.0 ** -11  # half an ulp of a 10-bit mantissa
    rel_t = np.abs(pf.round_to_tf32(v, "truncate").astype(np.float64) - v) / np.abs(v)
    assert rel_t.max() < 2.0 ** -10 and rel_t.mean() > rel.mean()
    with pytest.raises(ValueError, match="mode"):
        pf.round_to_tf32(1.0, "up")


def test_round_to():
    assert pf.round_to(1.0001, "tfloat32") == 1.0
    np.testing.assert_array_equal(pf.round_to([70000.0, 1e-8], "float16"), [np.inf, 0.0])
    assert pf.round_to(1.001, "bfloat16") == 1.0


# --------------------------------------------------------------------------- emulated matmuls


def test_emulated_matmul_reproduces_tensorflows_tf32_example():
    """TF's docs: 1.0001 x 1 summed over 1024 gives 1024.0 with TF32, ~1024.1 in float32."""
    x, y = np.full((2, 1024), 1.0001), np.ones((1024, 2))
    assert pf.emulated_matmul(x, y, "tfloat32")[0, 0] == 1024.0
    assert pf.emulated_matmul(x, y, "float32")[0, 0] == pytest.approx(1024.1, abs=0.01)
    assert pf.emulated_matmul(x, y).dtype == np.float32


def test_matmul_error_table_orders_the_formats():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(32, 128)), rng.normal(size=(128, 16))
    text = pf.matmul_error_table(a, b)
    med = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()[1:]}
    assert med["float32"] < 1e-5 < med["tfloat32"] < 1e-3 < med["bfloat16"]
    assert med["tfloat32"] == pytest.approx(med["float16"], rel=0.5)  # same 10-bit mantissa


@pytest.mark.parametrize("a, b, match", [(np.ones(3), np.ones((3, 1)), "2-D"), (np.ones((2, 3)), np.ones((2, 3)),
                                                                               "columns"),
                                         (np.full((1, 1), np.inf), np.ones((1, 1)), "finite")])
def test_emulated_matmul_bad_input(a, b, match):
    with pytest.raises(ValueError, match=match):
        pf.emulated_matmul(a, b)


def test_matmul_errors_are_the_table_and_input_rounding_dominates():
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=(64, 256)), rng.normal(size=(256, 64))
    errors = pf.matmul_errors(a, b)
    assert list(errors) == ["float32", "tfloat32", "float16", "bfloat16"]
    table = pf.matmul_error_table(a, b).splitlines()[1:]
    assert [line.split() for line in table] == [[n, f"{m:.1e}", f"{x:.1e}"] for n, (m, x) in errors.items()]
    # the 16-bit-mantissa rows come from rounding the inputs (half a unit roundoff, the same on every
    # machine); float32's from the summation order of the BLAS library
    for name in ("tfloat32", "float16", "bfloat16"):
        u = pf.float_format(name).eps / 2
        assert 0.3 * u < errors[name][0] < 0.7 * u, name
    assert pf.power_of_ten(errors["tfloat32"][0] / errors["float32"][0]) == 3
    with pytest.raises(ValueError, match="columns"):
        pf.matmul_errors(np.ones((2, 3)), np.ones((2, 3)))


@pytest.mark.parametrize("value, exponent", [(2.2e-4, -4), (1.5e-7, -7), (1.8e-3, -3), (1467.0, 3), (1.0, 0),
                                             (2.0e-7, -7), (5e-7, -6), (0.1, -1)])
def test_power_of_ten(value, exponent):
    assert pf.power_of_ten(value) == exponent


def test_power_of_ten_refuses_near_a_boundary():
    boundary = 10 ** -6.5  # 3.16e-7: as near 1e-7 as 1e-6 on a log scale
    with pytest.raises(ValueError, match="not the same on every machine"):
        pf.power_of_ten(boundary * 1.1)
    with pytest.raises(ValueError, match="boundary between 1e-7 and 1e-6"):
        pf.power_of_ten(boundary / 1.1)
    assert pf.power_of_ten(boundary / 1.1, margin=0.0) == -7  # no margin: plain rounding
    assert pf.power_of_ten(boundary * 1.3) == -6  # a factor 1.3 = 0.11 decades away: kept
    with pytest.raises(ValueError, match="value"):
        pf.power_of_ten(0.0)
    with pytest.raises(TypeError, match="value"):
        pf.power_of_ten("1e-4")
    with pytest.raises(ValueError, match="margin"):
        pf.power_of_ten(1.0, margin=0.5)
