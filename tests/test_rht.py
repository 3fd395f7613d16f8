"""Tests for rht.py: the 16-point random Hadamard transform (docs/NUMERICS.md §5).

Every check compares against an independent construction: the Sylvester recursion for H16,
a dense matmul (x * signs) @ H16, and the fixed fp32 butterfly the kernels must reproduce.
"""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import rht  # noqa: E402


def sylvester(n):
    """Sylvester Hadamard matrix of order n (entries +-1), built by the doubling recursion."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def butterfly_rht(x, signs):
    """The fixed fp32 order of the RHT: x*signs, stages h = 1, 2, 4, 8 of (a, b) -> (a+b, a-b)
    on pairs (i, i+h) with i & h == 0, then * 0.25. x: fp32 [..., 16]."""
    x = x * signs
    lead = x.shape[:-1]
    for h in (1, 2, 4, 8):
        v = x.reshape(*lead, 16 // (2 * h), 2, h)  # index = j*2h + s*h + r; s=0 is i, s=1 is i+h
        a, b = v[..., 0, :], v[..., 1, :]
        x = torch.stack((a + b, a - b), dim=-2).reshape(*lead, 16)
    return x * 0.25


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_hadamard_is_scaled_sylvester_and_orthonormal(n):
    h = rht.hadamard(n)
    assert h.dtype == torch.float32 and h.shape == (n, n)
    expected = (sylvester(n) / n ** 0.5).float()  # exact for n = 4, 16; fp32-rounded otherwise
    torch.testing.assert_close(h, expected, rtol=2 ** -23, atol=0)
    eye = torch.eye(n)
    torch.testing.assert_close(h @ h.T, eye, rtol=0, atol=1e-6)
    torch.testing.assert_close(h.T @ h, eye, rtol=0, atol=1e-6)


def test_hadamard_16_entries_are_plus_minus_quarter():
    h = rht.hadamard()
    assert h.shape == (16, 16)
    assert set(h.flatten().tolist()) == {0.25, -0.25}
    # entry (i, j) of Sylvester's construction is (-1)^popcount(i & j)
    for i in range(16):
        for j in range(16):
            assert h[i, j].item() == 0.25 * (-1) ** bin(i & j).count("1")


def test_random_signs_deterministic_plus_minus_one():
    s0 = rht.random_signs(0)
    assert s0.dtype == torch.float32 and s0.shape == (16,)
    assert set(s0.tolist()) <= {1.0, -1.0}
    assert torch.equal(s0, rht.random_signs(0))
    draws = [rht.random_signs(seed) for seed in range(8)]
    for seed, s in enumerate(draws):
        assert set(s.tolist()) <= {1.0, -1.0}
        assert torch.equal(s, rht.random_signs(seed))
    distinct = {tuple(s.tolist()) for s in draws}
    assert len(distinct) >= 6, "different seeds should give different sign vectors"
    # not all +1 (a seed-independent identity would make the 'random' in RHT vacuous)
    assert any((s < 0).any() for s in draws)
    # the global RNG is not consumed or disturbed
    torch.manual_seed(123)
    a = torch.rand(3)
    torch.manual_seed(123)
    rht.random_signs(5)
    assert torch.equal(torch.rand(3), a)


def test_rht_equals_dense_matmul_and_butterfly_bits():
    torch.manual_seed(0)
    x = torch.randn(5, 7, 64) * torch.logspace(-3, 3, 64)
    signs = rht.random_signs(3)
    y = rht.rht(x, signs)
    assert y.shape == x.shape and y.dtype == torch.float32
    dense = ((x.double().reshape(5, 7, 4, 16) * signs.double()) @ (sylvester(16) / 4)).reshape(5, 7, 64)
    torch.testing.assert_close(y.double(), dense, rtol=1e-5, atol=1e-5 * x.abs().max().item())
    # the fixed fp32 butterfly is the contract the kernels reproduce bit for bit
    bits = butterfly_rht(x.reshape(5, 7, 4, 16), signs).reshape(5, 7, 64)
    assert torch.equal(y, bits)


def test_rht_along_dim0_matches_transposed():
    torch.manual_seed(1)
    x = torch.randn(48, 20)
    signs = rht.random_signs(1)
    y0 = rht.rht(x, signs, dim=0)
    assert y0.shape == x.shape
    assert torch.equal(y0, rht.rht(x.T.contiguous(), signs, dim=-1).T)
    assert torch.equal(rht.rht_inverse(y0, signs, dim=0), rht.rht_inverse(y0.T.contiguous(), signs).T)


def test_rht_inverse_round_trip():
    torch.manual_seed(2)
    x = torch.randn(9, 32, 16)
    signs = rht.random_signs(7)
    for dim in (-1, 1):
        y = rht.rht(x, signs, dim=dim)
        assert not torch.allclose(y, x)
        back = rht.rht_inverse(y, signs, dim=dim)
        torch.testing.assert_close(back, x, rtol=0, atol=1e-6)
    # inverse reference: butterfly, * 0.25, then * signs
    y = rht.rht(x, signs)
    inv = butterfly_rht(y, torch.ones(16)) * signs
    assert torch.equal(rht.rht_inverse(y, signs), inv)


def test_rht_preserves_gemm_product():
    torch.manual_seed(3)
    a = torch.randn(24, 64)
    b = torch.randn(40, 64)
    signs = rht.random_signs(11)
    prod = rht.rht(a, signs) @ rht.rht(b, signs).T
    ref = (a.double() @ b.double().T)
    torch.testing.assert_close(prod.double(), ref, rtol=0, atol=1e-4)
    # different sign vectors on the two operands do not preserve it: the test has teeth
    wrong = rht.rht(a, signs) @ rht.rht(b, rht.random_signs(12)).T
    assert (wrong.double() - ref).abs().max() > 1.0


def test_rht_preserves_norm_and_spreads_outliers():
    x = torch.zeros(1, 16)
    x[0, 5] = 8.0
    y = rht.rht(x, rht.random_signs(0))
    assert torch.equal(y.abs(), torch.full((1, 16), 2.0))  # a spike becomes a flat +-2 row
    torch.manual_seed(4)
    x = torch.randn(100, 32)
    y = rht.rht(x, rht.random_signs(0))
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=0)


def test_rht_keeps_dtype_or_computes_fp32():
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    y = rht.rht(x, rht.random_signs(0))
    assert y.shape == x.shape
    ref = butterfly_rht(x.float().reshape(4, 2, 16), rht.random_signs(0)).reshape(4, 32)
    torch.testing.assert_close(y.float(), ref, rtol=2 ** -7, atol=0)


def test_rht_rejects_size_not_multiple_of_16():
    with pytest.raises(ValueError, match="16"):
        rht.rht(torch.randn(4, 24), rht.random_signs(0))
    with pytest.raises(ValueError, match="16"):
        rht.rht(torch.randn(20, 32), rht.random_signs(0), dim=0)
