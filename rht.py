"""The random Hadamard transform (RHT) used by the 4-bit recipes.

A Hadamard matrix H of order 16 (Sylvester construction, entries +-1/4, so H Hᵀ = I) mixes every
16 consecutive elements of the reduction dimension. Mixing spreads an outlier over its 16 neighbours,
which makes the block's values look more Gaussian before they are quantized. A random sign vector
makes the rotation H' = diag(signs) · H random but cheap. Both operands of a GEMM receive the same
H', so (A·H')(B·H')ᵀ = A·H'·H'ᵀ·Bᵀ = A·Bᵀ: the product is unchanged in exact arithmetic.

We apply H with the fast Walsh-Hadamard butterfly in a fixed order (stages h = 1, 2, 4, 8), so the
fp32 result is fully determined and a Triton kernel can reproduce it bit for bit.
"""

import torch

RHT_SIZE = 16


def hadamard(n: int = RHT_SIZE) -> torch.Tensor:
    """The orthonormal Sylvester Hadamard matrix of order n (a power of two), as fp32."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"hadamard(n) needs n to be a power of two, got {n}")
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n**0.5


def random_signs(seed: int, n: int = RHT_SIZE) -> torch.Tensor:
    """A vector of n random +-1 values (fp32), the same for a given seed on every machine and rank.
    The bits come from splitmix64 in plain Python integers (no torch.Generator, so torch.compile
    can build the vector inside a compiled region)."""
    z = (int(seed) * 0x9E3779B97F4A7C15 + 0x9E3779B97F4A7C15) & (2**64 - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
    z ^= z >> 31
    return torch.tensor([1.0 - 2.0 * ((z >> i) & 1) for i in range(n)])


def _butterfly(x: torch.Tensor) -> torch.Tensor:
    """x @ (4·H16) along the last dim (size 16), in the fixed order h = 1, 2, 4, 8."""
    shape = x.shape
    for h in (1, 2, 4, 8):
        pairs = x.reshape(*shape[:-1], RHT_SIZE // (2 * h), 2, h)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        x = torch.stack([a + b, a - b], dim=-2).reshape(shape)
    return x


def _groups(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Move `dim` last and split it into groups of 16 (checking the size)."""
    if x.shape[dim] % RHT_SIZE:
        raise ValueError(
            f"RHT needs the size of dim {dim} to be a multiple of {RHT_SIZE}; tensor shape is "
            f"{tuple(x.shape)}. Pad the tensor or turn RHT off for this operand."
        )
    x = x.movedim(dim, -1)
    return x.reshape(*x.shape[:-1], -1, RHT_SIZE)


def rht(x: torch.Tensor, signs: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """x·H' on every 16 consecutive elements along dim; computed in fp32, returned in x.dtype."""
    g = _groups(x, dim).float() * signs.to(x.device, torch.float32)
    y = _butterfly(g) * 0.25
    return y.reshape(*y.shape[:-2], -1).movedim(-1, dim).to(x.dtype)


def rht_inverse(x: torch.Tensor, signs: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """x·H'ᵀ = (x·H)·diag(signs): undoes rht(); computed in fp32, returned in x.dtype."""
    g = _groups(x, dim).float()
    y = _butterfly(g) * 0.25 * signs.to(x.device, torch.float32)
    return y.reshape(*y.shape[:-2], -1).movedim(-1, dim).to(x.dtype)
