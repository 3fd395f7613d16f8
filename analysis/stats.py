"""Small-sample statistics for comparing runs over seeds, with numpy and the standard library only.

A study trains each recipe on a handful of seeds; a metric's mean over n seeds comes with a 95 %
Student-t interval, mean ± t(0.975, n−1) · s / √n (s: the sample standard deviation, ddof=1). The t
quantile is computed here, not looked up: the t distribution's CDF is an incomplete beta function,
    P(|T| > t) = I_x(ν/2, 1/2),  x = ν / (ν + t²),
evaluated by its continued fraction and inverted by bisection. `seeds_needed` turns a pilot's seed
spread into the number of seeds whose interval is no wider than a chosen half-width.
"""
import math

import numpy as np


def _beta_cf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, f, c, d = 1e-300, 1.0, 1.0, 0.0
    for m in range(300):
        for k in (0, 1):  # the even and the odd term of the m-th pair
            if m == 0 and k == 0:
                num = 1.0
            elif k == 0:
                num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
            else:
                num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return f - 1.0


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc: x must lie in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast below this point: use the symmetry
        return 1.0 - betainc(b, a, 1.0 - x)
    log_front = a * math.log(x) + b * math.log1p(-x) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    return math.exp(log_front) / a * _beta_cf(a, b, x)


def t_sf2(t: float, df: float) -> float:
    """Two-sided tail P(|T| > t) of Student's t with df degrees of freedom."""
    return betainc(df / 2, 0.5, df / (df + t * t))


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t, 0.5 <= p < 1 (e.g. 0.975 for a 95 % two-sided interval)."""
    if not 0.5 <= p < 1 or df <= 0:
        raise ValueError(f"t_quantile: need 0.5 <= p < 1 and df > 0, got p={p}, df={df}")
    lo, hi = 0.0, 1.0
    while t_sf2(hi, df) > 2 * (1 - p):
        hi *= 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_sf2(mid, df) > 2 * (1 - p) else (lo, mid)
    return 0.5 * (lo + hi)


def mean_ci(values, level: float = 0.95) -> dict:
    """{'n', 'mean', 'sd', 'half'}: the mean and the half-width of its two-sided t interval. Non-finite
    values are an error; one value has no interval (sd and half are NaN)."""
    v = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(v)):
        raise ValueError(f"mean_ci: non-finite values {v.tolist()}")
    n = v.size
    if n == 0:
        return {"n": 0, "mean": math.nan, "sd": math.nan, "half": math.nan}
    if n == 1:
        return {"n": 1, "mean": float(v[0]), "sd": math.nan, "half": math.nan}
    sd = float(v.std(ddof=1))
    return {"n": n, "mean": float(v.mean()), "sd": sd, "half": t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)}


def fmt_ci(ci: dict, digits: int = 3) -> str:
    """'+0.123 ± 0.045 (n=5)'; one value: '+0.123 (n=1)'."""
    if ci["n"] == 0:
        return "–"
    text = f"{ci['mean']:+.{digits}f}"
    return text + (f" ± {ci['half']:.{digits}f}" if ci["n"] > 1 else "") + f" (n={ci['n']})"


def seeds_needed(sd: float, half: float, level: float = 0.95, max_n: int = 10000) -> int:
    """The fewest seeds n (>= 2) whose t interval t(level, n−1) · sd / √n is at most `half`, for a
    metric whose seed-to-seed standard deviation is sd (e.g. measured on pilot seeds)."""
    if not (sd >= 0 and half > 0):
        raise ValueError(f"seeds_needed: need sd >= 0 and half > 0, got sd={sd}, half={half}")
    for n in range(2, max_n + 1):
        if t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n) <= half:
            return n
    raise ValueError(f"seeds_needed: more than {max_n} seeds for sd={sd}, half-width {half}")
