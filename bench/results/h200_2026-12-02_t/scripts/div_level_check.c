/* For every divisor significand s in [1,2) and every dividend x whose quotient x/s lies within
   +-20 ulps of a rounding decision point (a level midpoint of E2M1 or of a uniform grid; by scaling,
   only the significand of the point matters), compare q = fma(fma(-s, q0, x), r, q0), q0 = RN(x*r),
   r = RN(1/s), with RN(x/s); where they differ, compare the codes at every scaling. */
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
static float f_of(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
static uint32_t b_of(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }
static int e2m1_code(double a) { double t = fmin(fmin(2 * a, a + 2), a / 2 + 4); return (int)rint(t); }
static int uni_code(double a) { double t = rint(a); return t > 7 ? 7 : (int)t; }
int main(void) {
    const double B[] = {1.0, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75};
    long n = 0, diff = 0, code_diff = 0, maxulp = 0;
    for (uint32_t S = 0; S < (1u << 23); S++) {
        float s = f_of(0x3F800000u | S);
        float r = 1.0f / s;
        for (int i = 0; i < 7; i++) {
            float x0 = (float)(B[i] * (double)s);
            for (int d = -20; d <= 20; d++) {
                float x = f_of(b_of(x0) + d);
                float ref = x / s;
                float q0 = x * r;
                float rem = fmaf(-s, q0, x);
                float q = fmaf(rem, r, q0);
                n++;
                long u = (long)b_of(q) - (long)b_of(ref);
                if (u < 0) u = -u;
                if (u > maxulp) maxulp = u;
                if (b_of(q) != b_of(ref)) {
                    diff++;
                    for (int j = -8; j <= 8; j++) {
                        double a = ldexp((double)q, j), c = ldexp((double)ref, j);
                        if (a <= 8 && (e2m1_code(a) != e2m1_code(c) || uni_code(a) != uni_code(c))) {
                            if (code_diff < 10) printf("code differs: s=%a x=%a q=%a ref=%a j=%d\n", s, x, q, ref, j);
                            code_diff++;
                        }
                    }
                }
            }
        }
    }
    printf("pairs %ld, q != RN(x/s): %ld, max ulps %ld, code differs: %ld\n", n, diff, maxulp, code_diff);
    return 0;
}
