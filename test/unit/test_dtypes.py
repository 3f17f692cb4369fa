"""bfloat16 conversion (`etc.f32_to_bf16`, `etc.bf16_to_f32`): round to
nearest even, NaN kept NaN, every float32 bit pattern as the widening
arithmetic it replaced."""

from __future__ import annotations

import numpy as np

import etc


def _bits(*words: int) -> np.ndarray:
    return np.array(words, np.uint32).view(np.float32)


def test_rounding_to_nearest_even_at_the_halfway_points():
    x = _bits(0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0xBF808000, 0xBF818000)
    # 1 + 2^-8 exactly between 0x3F80 and 0x3F81: to the even one, 0x3F80.
    np.testing.assert_array_equal(
        etc.f32_to_bf16(x), np.array([0x3F80, 0x3F82, 0x3F80, 0x3F81, 0xBF80, 0xBF82], np.uint16)
    )


def test_special_values():
    x = _bits(
        0x7F800000,
        0xFF800000,
        0x7F7FFFFF,
        0x00000001,
        0x80000000,
        0x7FC00000,
        0x7F800001,
        0xFFFFFFFF,
    )
    out = etc.f32_to_bf16(x)
    # inf, -inf; the largest float32 rounds up to inf; a denormal to +0; -0 stays -0.
    np.testing.assert_array_equal(
        out[:5], np.array([0x7F80, 0xFF80, 0x7F80, 0x0000, 0x8000], np.uint16)
    )
    # NaNs stay quiet NaNs of their sign, even those whose rounding would carry into inf or past.
    back = etc.bf16_to_f32(out[5:])
    assert np.isnan(back).all() and (out[5:] & 0x0040).all()
    assert list(np.signbit(back)) == [False, False, True]


def test_every_bit_pattern_as_the_64_bit_arithmetic():
    rng = np.random.default_rng(7)
    words = rng.integers(0, 2**32, 1 << 20, dtype=np.uint64)
    x = words.astype(np.uint32).view(np.float32).reshape(1024, 1024)
    want = ((words + 0x7FFF + ((words >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x.reshape(-1))
    want[nan] = ((words[nan] >> 16) | 0x40).astype(np.uint16)
    got = etc.f32_to_bf16(x)
    assert got.shape == (1024, 1024)
    np.testing.assert_array_equal(got.reshape(-1), want)
    # Widening is exact: every non-NaN bf16 comes back to the same bits.
    finite = ~np.isnan(etc.bf16_to_f32(got))
    np.testing.assert_array_equal(etc.f32_to_bf16(etc.bf16_to_f32(got))[finite], got[finite])
