/* kquants.c: q4_K, q5_K and q6_K quantizers, byte-identical to ggml-quants.c's
 * quantize_row_{q4,q5,q6}_K_ref (no importance matrix), i.e. to minfer/quants/quantize_k.py.
 *
 * Entry points (all return 0; x: [nsb * 256] float32, out: [nsb * block_bytes] uint8):
 *   minfer_quantize_q4_K(x, out, nsb)   144-byte blocks (d, dmin, scales[12], qs[128])
 *   minfer_quantize_q5_K(x, out, nsb)   176-byte blocks (d, dmin, scales[12], qh[32], qs[128])
 *   minfer_quantize_q6_K(x, out, nsb)   210-byte blocks (ql[128], qh[64], scales[16], d)
 *   minfer_f32_to_f16(x, out, n)        GGML_FP32_TO_FP16 (round to nearest even), for tests
 *
 * Built at run time by minfer/quants/ckernel.py (system C compiler, cached, loaded with ctypes;
 * the numpy path is the fallback and the twin the tests compare against).
 *
 * Speed without changing a single rounding: the sub-blocks of one super-block (8 for q4_K/q5_K,
 * 16 for q6_K) are the lanes of a GCC/clang vector; each lane runs exactly the scalar C
 * sequence of its sub-block (same float32 ops, same order, sequential sums), lanes never mix.
 * Exactness needs: no FMA contraction (-ffp-contract=off, set by the builder), no fast-math,
 * IEEE float32 vector arithmetic (SSE/AVX/NEON all are). nearest_int is ggml's magic-number
 * trick done on the bit pattern, so no float->int conversion (and no UB) even on inf/NaN lanes.
 */

#include <math.h>
#include <stdint.h>
#include <string.h>

/* lanes per vector: the native float32 width (256-bit AVX, else 128-bit SSE/NEON); wider
 * vector types would be split by the compiler into slow element-wise code */
#if defined(__AVX__)
#define NL 8
#else
#define NL 4
#endif
typedef float vf __attribute__((vector_size(4 * NL)));
typedef int32_t vi __attribute__((vector_size(4 * NL)));

_Static_assert(sizeof(float) == 4 && sizeof(vf) == 4 * NL && 8 % NL == 0, "float32 lanes");

#define QK_K 256
#define MAGIC 12582912.0f  /* 1.5 * 2^23 */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline int nearest_int(float f) {  /* round half to even for |f| < 2^22, as ggml */
    return (int)(f32_bits(f + MAGIC) & 0x007FFFFF) - 0x00400000;
}

/* ---- fp16 (round to nearest even; ggml's GGML_FP32_TO_FP16 gives the same bits) ---------- */

static uint16_t f32_to_f16(float f) {
    uint32_t x = f32_bits(f), sign = (x >> 16) & 0x8000, ax = x & 0x7FFFFFFF;
    if (ax > 0x7F800000) return (uint16_t)(sign | 0x7E00);            /* NaN */
    if (ax >= 0x477FF000) return (uint16_t)(sign | 0x7C00);           /* >= 65520: inf */
    if (ax < 0x38800000) {                                            /* < 2^-14: subnormal */
        float v = fabsf(f) * 0x1p24f;                                 /* exact, < 1024 */
        return (uint16_t)(sign | (uint32_t)nearest_int(v));          /* 1024 = min normal */
    }
    uint32_t r = ax + 0x0FFF + ((ax >> 13) & 1);                      /* RNE on 13 dropped bits */
    return (uint16_t)(sign | ((r - (112u << 23)) >> 13));
}

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0) {
        float v = (float)m * 0x1p-24f;                                /* exact */
        return sign ? -v : v;
    }
    if (e == 31) return bits_f32(sign | 0x7F800000 | (m << 13));
    return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

void minfer_f32_to_f16(const float *x, uint16_t *out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = f32_to_f16(x[i]);
}

/* ---- lane helpers ------------------------------------------------------------------------ */

static inline vf sel(vi m, vf a, vf b) { return (vf)((m & (vi)a) | (~m & (vi)b)); }
static inline vi seli(vi m, vi a, vi b) { return (m & a) | (~m & b); }
static inline vf vabs(vf a) { return (vf)((vi)a & 0x7FFFFFFF); }

/* MAX(lo, MIN(hi, nearest_int(v))) per lane, as float (an exact small integer) */
static inline vf levels(vf v, int lo, int hi) {
    vi l = ((vi)(v + MAGIC) & 0x007FFFFF) - 0x00400000;
    l = seli(l > hi, (vi){0} + hi, l);
    l = seli(l < lo, (vi){0} + lo, l);
    return __builtin_convertvector(l, vf);
}

static inline int any(vi m) {
    int r = 0;
    for (int k = 0; k < NL; ++k) r |= m[k];
    return r != 0;
}

/* ---- make_qkx2_quants (use_mad = false), NL sub-blocks of 32 at once -----------------------
 * x, w: [32] (x[i][j] = weight i of sub-block j). L: [32] out, levels 0..nmax.
 * Returns scale; *the_min = -min. Each lane follows ggml's scalar loop exactly. */
static vf make_qkx2(const vf *x, const vf *w, vf *L, vf *the_min, int nmax, float rmin,
                    float rdelta, int nstep) {
    vf mn = x[0], mx = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < 32; ++i) {
        mn = sel(x[i] < mn, x[i], mn);
        mx = sel(x[i] > mx, x[i], mx);
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    mn = sel(mn > 0, (vf){0}, mn);  /* if (min > 0) min = 0 */
    vi flat = mx == mn;              /* C returns at once: L = 0, scale 0, the_min = -min */
    vf min0 = mn;
    vf iscale = (float)nmax / (mx - mn);
    vf scale = 1.0f / iscale;
    vf best = {0};
    vf Laux[32];
    for (int i = 0; i < 32; ++i) {
        L[i] = levels(iscale * (x[i] - mn), 0, nmax);
        vf diff = scale * L[i] + mn - x[i];
        diff = diff * diff;
        best += w[i] * diff;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (mx - mn);
        vf sum_l = {0}, sum_l2 = {0}, sum_xl = {0};
        for (int i = 0; i < 32; ++i) {
            vf l = levels(iscale * (x[i] - mn), 0, nmax);
            Laux[i] = l;
            vf wl = w[i] * l;
            sum_l += wl;
            sum_l2 += wl * l;
            sum_xl += wl * x[i];
        }
        /* C skips the rest unless D > 0; computing it anyway and masking changes nothing */
        vf D = sum_w * sum_l2 - sum_l * sum_l;
        vf this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        vf this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        vi pos = this_min > 0;
        this_min = sel(pos, (vf){0}, this_min);
        this_scale = sel(pos, sum_xl / sum_l2, this_scale);
        vf cur = {0};
        for (int i = 0; i < 32; ++i) {
            vf diff = this_scale * Laux[i] + this_min - x[i];
            diff = diff * diff;
            cur += w[i] * diff;
        }
        vi upd = (D > 0) & (cur < best);
        if (any(upd)) {
            for (int i = 0; i < 32; ++i) L[i] = sel(upd, Laux[i], L[i]);
            best = sel(upd, cur, best);
            scale = sel(upd, this_scale, scale);
            mn = sel(upd, this_min, mn);
        }
    }
    if (any(flat)) {
        for (int i = 0; i < 32; ++i) L[i] = sel(flat, (vf){0}, L[i]);
        scale = sel(flat, (vf){0}, scale);
        mn = sel(flat, min0, mn);
    }
    *the_min = -mn;
    return scale;
}

/* Shared first half of q4_K / q5_K: scales, mins, d, dmin, packed 6-bit scales, levels.
 * xs: [256] one super-block. Writes dd[0..3] (d, dmin as f16 LE), sc[12], Lout[256]. */
static void qk_min_type(const float *xs, int nmax, float rmin, float rdelta, int nstep,
                        uint8_t *dd, uint8_t *sc, uint8_t *Lout) {
    float scales[8], mins[8];
    uint8_t Ls[256];  /* the search's levels, [sub-block][32] */
    for (int g = 0; g < 8; g += NL) {  /* lanes: sub-blocks g .. g + NL - 1 */
        vf x[32], w[32], L[32], the_min, sum_x2 = {0}, av_x;
        for (int j = 0; j < NL; ++j)
            for (int i = 0; i < 32; ++i) x[i][j] = xs[32 * (g + j) + i];
        for (int i = 0; i < 32; ++i) sum_x2 += x[i] * x[i];
        for (int j = 0; j < NL; ++j) av_x[j] = sqrtf(sum_x2[j] / 32);
        for (int i = 0; i < 32; ++i) w[i] = av_x + vabs(x[i]);
        vf s = make_qkx2(x, w, L, &the_min, nmax, rmin, rdelta, nstep);
        for (int j = 0; j < NL; ++j) {
            scales[g + j] = s[j];
            mins[g + j] = the_min[j];
            for (int i = 0; i < 32; ++i) Ls[32 * (g + j) + i] = (uint8_t)L[i][j];
        }
    }

    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; ++j) {
        uint8_t a = (uint8_t)nearest_int(inv_scale * scales[j]);
        uint8_t b = (uint8_t)nearest_int(inv_min * mins[j]);
        ls[j] = a < 63 ? a : 63;
        lm[j] = b < 63 ? b : 63;
    }
    for (int j = 0; j < 4; ++j) {
        sc[j] = ls[j] | (uint8_t)((ls[j + 4] >> 4) << 6);
        sc[j + 4] = lm[j] | (uint8_t)((lm[j + 4] >> 4) << 6);
        sc[j + 8] = (ls[j + 4] & 0xF) | (uint8_t)((lm[j + 4] & 0xF) << 4);
    }
    uint16_t d16 = f32_to_f16(max_scale / 63.f), dm16 = f32_to_f16(max_min / 63.f);
    memcpy(dd, &d16, 2);  /* little-endian hosts only: ckernel.py does not load us elsewhere */
    memcpy(dd + 2, &dm16, 2);
    float fd = f16_to_f32(d16), fdm = f16_to_f32(dm16);
    for (int j = 0; j < 8; ++j) {
        const float d = fd * ls[j];
        if (!d) {  /* `if (!d) continue;` keeps the search's levels */
            memcpy(Lout + 32 * j, Ls + 32 * j, 32);
            continue;
        }
        const float dm = fdm * lm[j];
        for (int i = 0; i < 32; ++i) {
            int l = nearest_int((xs[32 * j + i] + dm) / d);
            Lout[32 * j + i] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        }
    }
}

int minfer_quantize_q4_K(const float *x, uint8_t *out, int64_t nsb) {
    uint8_t L[QK_K];
    for (int64_t b = 0; b < nsb; ++b, x += QK_K, out += 144) {
        qk_min_type(x, 15, -1.f, 0.1f, 20, out, out + 4, L);
        uint8_t *q = out + 16;
        for (int j = 0; j < QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; ++l) q[l] = L[j + l] | (uint8_t)(L[j + l + 32] << 4);
    }
    return 0;
}

int minfer_quantize_q5_K(const float *x, uint8_t *out, int64_t nsb) {
    uint8_t L[QK_K];
    for (int64_t b = 0; b < nsb; ++b, x += QK_K, out += 176) {
        qk_min_type(x, 31, -0.5f, 0.1f, 15, out, out + 4, L);
        uint8_t *qh = out + 16, *ql = out + 48;
        memset(qh, 0, 32);
        uint8_t m1 = 1, m2 = 2;
        for (int n = 0; n < QK_K; n += 64, ql += 32, m1 <<= 2, m2 <<= 2) {
            for (int j = 0; j < 32; ++j) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) { l1 -= 16; qh[j] |= m1; }
                if (l2 > 15) { l2 -= 16; qh[j] |= m2; }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
        }
    }
    return 0;
}

/* ---- q6_K ------------------------------------------------------------------------------- */

#define GROUP_MAX_EPS 1e-15f

/* make_qx_quants(16, nmax = 32, x, L, rmse_type = 1, qw = NULL) for NL sub-blocks of 16.
 * x: [16] lanes. L: [16] out, levels 0..63. Returns scale (0 for all-zero sub-blocks). */
static vf make_qx(const vf *x, vf *L) {
    const int nmax = 32;
    vf w[16], wx[16], amax = {0}, mx = {0};
    for (int i = 0; i < 16; ++i) {  /* the first value of largest |x|: `if (ax > amax)` */
        vf ax = vabs(x[i]);
        vi gt = ax > amax;
        amax = sel(gt, ax, amax);
        mx = sel(gt, x[i], mx);
        w[i] = x[i] * x[i];
        wx[i] = w[i] * x[i];  /* C: w*x[i]*l = (w*x)*l */
    }
    vi zero = amax < GROUP_MAX_EPS;  /* C returns 0 with L = 0 */
    vf iscale = (float)(-nmax) / mx;
    vf sumlx = {0}, suml2 = {0};
    for (int i = 0; i < 16; ++i) {
        vf l = levels(iscale * x[i], -nmax, nmax - 1);
        L[i] = l + (float)nmax;
        sumlx += wx[i] * l;
        suml2 += w[i] * l * l;
    }
    vf scale = sel(suml2 != 0, sumlx / suml2, (vf){0});
    vf best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)is) / mx;
        vf lv[16];
        sumlx = (vf){0};
        suml2 = (vf){0};
        for (int i = 0; i < 16; ++i) {
            lv[i] = levels(iscale * x[i], -nmax, nmax - 1);
            sumlx += wx[i] * lv[i];
            suml2 += w[i] * lv[i] * lv[i];
        }
        vi upd = (suml2 > 0) & (sumlx * sumlx > best * suml2);
        if (any(upd)) {
            for (int i = 0; i < 16; ++i) L[i] = sel(upd, lv[i] + (float)nmax, L[i]);
            scale = sel(upd, sumlx / suml2, scale);
            best = sel(upd, scale * sumlx, best);
        }
    }
    if (any(zero))
        for (int i = 0; i < 16; ++i) L[i] = sel(zero, (vf){0}, L[i]);
    return sel(zero, (vf){0}, scale);
}

int minfer_quantize_q6_K(const float *xin, uint8_t *out, int64_t nsb) {
    for (int64_t b = 0; b < nsb; ++b, xin += QK_K, out += 210) {
        float scale[16];
        uint8_t Lb[QK_K];  /* [sub-block][16], levels 0..63 */
        for (int g = 0; g < 16; g += NL) {
            vf x[16], L[16];
            for (int j = 0; j < NL; ++j)
                for (int i = 0; i < 16; ++i) x[i][j] = xin[16 * (g + j) + i];
            vf s = make_qx(x, L);
            for (int j = 0; j < NL; ++j) {
                scale[g + j] = s[j];
                for (int i = 0; i < 16; ++i) Lb[16 * (g + j) + i] = (uint8_t)L[i][j];
            }
        }
        float max_scale = 0, max_abs_scale = 0;
        for (int j = 0; j < 16; ++j) {
            float a = fabsf(scale[j]);
            if (a > max_abs_scale) { max_abs_scale = a; max_scale = scale[j]; }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {  /* all zero: d = 0 and nothing else */
            memset(out, 0, 210);
            continue;
        }
        int8_t *scales = (int8_t *)(out + 192);
        float isc = -128.f / max_scale;
        uint16_t d16 = f32_to_f16(1 / isc);
        memcpy(out + 208, &d16, 2);
        for (int j = 0; j < 16; ++j) {
            int q = nearest_int(isc * scale[j]);
            scales[j] = (int8_t)(uint8_t)(q < 127 ? q : 127);
        }
        float fd = f16_to_f32(d16);
        for (int j = 0; j < 16; ++j) {
            float d = fd * scales[j];
            if (!d) continue;  /* keeps the search's levels */
            for (int i = 0; i < 16; ++i) {
                int l = nearest_int(xin[16 * j + i] / d);
                Lb[16 * j + i] = (uint8_t)((l < -32 ? -32 : l > 31 ? 31 : l) + 32);
            }
        }
        uint8_t *ql = out, *qh = out + 128;
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; ++l) {
                uint8_t q1 = Lb[j + l] & 0xF, q2 = Lb[j + l + 32] & 0xF;
                uint8_t q3 = Lb[j + l + 64] & 0xF, q4 = Lb[j + l + 96] & 0xF;
                ql[l] = q1 | (uint8_t)(q3 << 4);
                ql[l + 32] = q2 | (uint8_t)(q4 << 4);
                qh[l] = (Lb[j + l] >> 4) | (uint8_t)((Lb[j + l + 32] >> 4) << 2) |
                        (uint8_t)((Lb[j + l + 64] >> 4) << 4) | (uint8_t)((Lb[j + l + 96] >> 4) << 6);
            }
        }
    }
    return 0;
}
