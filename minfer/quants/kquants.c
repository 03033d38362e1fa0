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
 * Speed without changing a single rounding: consecutive sub-blocks (of 32 for q4_K/q5_K, of 16
 * for q6_K) are the lanes of GCC/clang vectors (KI vectors of NL lanes, interleaved); each lane
 * runs exactly the scalar C sequence of its sub-block (same float32 ops, same order, sequential
 * sums), lanes never mix. Then the per-super-block part (6-bit / int8 scales, fp16 d, final
 * levels, packing) runs as plain scalar C.
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

/* KI lane vectors run interleaved: the sums are sequential chains of dependent adds, and two
 * independent chains per instruction stream hide the add latency (~1.5x on AVX2). */
#define KI 2
#define LANES (KI * NL)  /* sub-blocks searched at once */

/* ---- make_qkx2_quants (use_mad = false) for LANES sub-blocks of 32 -------------------------
 * x, w: [32][KI] (x[i][k][j] = weight i of sub-block k * NL + j). L: [32][KI] out, levels
 * 0..nmax. scale, the_min: [KI] out (the_min = -min). Each lane follows ggml's scalar loop. */
static void make_qkx2(const vf (*x)[KI], const vf (*w)[KI], vf (*L)[KI], vf *scale, vf *the_min,
                      int nmax, float rmin, float rdelta, int nstep) {
    vf mn[KI], mx[KI], sum_w[KI], sum_x[KI], min0[KI], best[KI], Laux[32][KI];
    vi flat[KI];
    for (int k = 0; k < KI; ++k) {
        mn[k] = mx[k] = x[0][k];
        sum_w[k] = w[0][k];
        sum_x[k] = sum_w[k] * x[0][k];
    }
    for (int i = 1; i < 32; ++i)
        for (int k = 0; k < KI; ++k) {
            mn[k] = sel(x[i][k] < mn[k], x[i][k], mn[k]);
            mx[k] = sel(x[i][k] > mx[k], x[i][k], mx[k]);
            sum_w[k] += w[i][k];
            sum_x[k] += w[i][k] * x[i][k];
        }
    vf iscale[KI];
    for (int k = 0; k < KI; ++k) {
        mn[k] = sel(mn[k] > 0, (vf){0}, mn[k]);  /* if (min > 0) min = 0 */
        flat[k] = mx[k] == mn[k];                 /* C returns at once: L = 0, scale 0 */
        min0[k] = mn[k];
        iscale[k] = (float)nmax / (mx[k] - mn[k]);
        scale[k] = 1.0f / iscale[k];
        best[k] = (vf){0};
    }
    for (int i = 0; i < 32; ++i)
        for (int k = 0; k < KI; ++k) {
            L[i][k] = levels(iscale[k] * (x[i][k] - mn[k]), 0, nmax);
            vf diff = scale[k] * L[i][k] + mn[k] - x[i][k];
            diff = diff * diff;
            best[k] += w[i][k] * diff;
        }
    for (int is = 0; is <= nstep; ++is) {
        const float num = rmin + rdelta * (float)is + (float)nmax;
        vf sum_l[KI], sum_l2[KI], sum_xl[KI], cur[KI], this_scale[KI], this_min[KI], D[KI];
        for (int k = 0; k < KI; ++k) {
            iscale[k] = num / (mx[k] - mn[k]);
            sum_l[k] = sum_l2[k] = sum_xl[k] = cur[k] = (vf){0};
        }
        for (int i = 0; i < 32; ++i)
            for (int k = 0; k < KI; ++k) {
                vf l = levels(iscale[k] * (x[i][k] - mn[k]), 0, nmax);
                Laux[i][k] = l;
                vf wl = w[i][k] * l;
                sum_l[k] += wl;
                sum_l2[k] += wl * l;
                sum_xl[k] += wl * x[i][k];
            }
        /* C skips the rest unless D > 0; computing it anyway and masking changes nothing */
        for (int k = 0; k < KI; ++k) {
            D[k] = sum_w[k] * sum_l2[k] - sum_l[k] * sum_l[k];
            this_scale[k] = (sum_w[k] * sum_xl[k] - sum_x[k] * sum_l[k]) / D[k];
            this_min[k] = (sum_l2[k] * sum_x[k] - sum_l[k] * sum_xl[k]) / D[k];
            vi pos = this_min[k] > 0;
            this_min[k] = sel(pos, (vf){0}, this_min[k]);
            this_scale[k] = sel(pos, sum_xl[k] / sum_l2[k], this_scale[k]);
        }
        for (int i = 0; i < 32; ++i)
            for (int k = 0; k < KI; ++k) {
                vf diff = this_scale[k] * Laux[i][k] + this_min[k] - x[i][k];
                diff = diff * diff;
                cur[k] += w[i][k] * diff;
            }
        for (int k = 0; k < KI; ++k) {
            vi upd = (D[k] > 0) & (cur[k] < best[k]);
            if (any(upd)) {
                for (int i = 0; i < 32; ++i) L[i][k] = sel(upd, Laux[i][k], L[i][k]);
                best[k] = sel(upd, cur[k], best[k]);
                scale[k] = sel(upd, this_scale[k], scale[k]);
                mn[k] = sel(upd, this_min[k], mn[k]);
            }
        }
    }
    for (int k = 0; k < KI; ++k) {
        if (any(flat[k])) {
            for (int i = 0; i < 32; ++i) L[i][k] = sel(flat[k], (vf){0}, L[i][k]);
            scale[k] = sel(flat[k], (vf){0}, scale[k]);
            mn[k] = sel(flat[k], min0[k], mn[k]);
        }
        the_min[k] = -mn[k];
    }
}

/* The q4_K / q5_K sub-block search over nsub (<= LANES) consecutive sub-blocks of 32 at x:
 * scales[s], mins[s], levels Ls[32 * s + i]. Missing lanes search zeros (flat) and are dropped. */
static void search_qkx2(const float *x, int nsub, int nmax, float rmin, float rdelta, int nstep,
                        float *scales, float *mins, uint8_t *Ls) {
    vf xt[32][KI], w[32][KI], L[32][KI], sc[KI], the_min[KI], sum_x2[KI];
    for (int s = 0; s < LANES; ++s)
        for (int i = 0; i < 32; ++i) xt[i][s / NL][s % NL] = s < nsub ? x[32 * s + i] : 0.0f;
    for (int k = 0; k < KI; ++k) sum_x2[k] = (vf){0};
    for (int i = 0; i < 32; ++i)
        for (int k = 0; k < KI; ++k) sum_x2[k] += xt[i][k] * xt[i][k];
    for (int k = 0; k < KI; ++k) {
        vf av_x;
        for (int j = 0; j < NL; ++j) av_x[j] = sqrtf(sum_x2[k][j] / 32);
        for (int i = 0; i < 32; ++i) w[i][k] = av_x + vabs(xt[i][k]);
    }
    make_qkx2(xt, w, L, sc, the_min, nmax, rmin, rdelta, nstep);
    for (int s = 0; s < nsub; ++s) {
        scales[s] = sc[s / NL][s % NL];
        mins[s] = the_min[s / NL][s % NL];
        for (int i = 0; i < 32; ++i) Ls[32 * s + i] = (uint8_t)L[i][s / NL][s % NL];
    }
}

/* Second half of q4_K / q5_K for one super-block xs [256], from its 8 sub-block scales, mins
 * and search levels Ls [256]: writes dd[0..3] (d, dmin as f16 LE), sc[12], final Lout[256]. */
static void qk_finish(const float *xs, int nmax, const float *scales, const float *mins,
                      const uint8_t *Ls, uint8_t *dd, uint8_t *sc, uint8_t *Lout) {
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

/* q4_K / q5_K: search CH super-blocks' sub-blocks LANES at a time, then finish and pack each */
#define CH 8
_Static_assert((CH * 8) % LANES == 0, "whole lane groups per chunk");

typedef void (*pack_fn)(const uint8_t *L, uint8_t *block);

static void quantize_min_type(const float *x, uint8_t *out, int64_t nsb, int nmax, float rmin,
                              float rdelta, int nstep, int block_bytes, pack_fn pack) {
    float scales[CH * 8], mins[CH * 8];
    uint8_t Ls[CH * QK_K], L[QK_K];
    for (int64_t b0 = 0; b0 < nsb; b0 += CH) {
        int n = nsb - b0 < CH ? (int)(nsb - b0) : CH;
        const float *xc = x + b0 * QK_K;
        for (int s = 0; s < 8 * n; s += LANES) {
            int nsub = 8 * n - s < LANES ? 8 * n - s : LANES;
            search_qkx2(xc + 32 * s, nsub, nmax, rmin, rdelta, nstep, scales + s, mins + s,
                        Ls + 32 * s);
        }
        for (int b = 0; b < n; ++b) {
            uint8_t *blk = out + (b0 + b) * block_bytes;
            qk_finish(xc + b * QK_K, nmax, scales + 8 * b, mins + 8 * b, Ls + b * QK_K, blk,
                      blk + 4, L);
            pack(L, blk);
        }
    }
}

static void pack_q4_K(const uint8_t *L, uint8_t *blk) {
    uint8_t *q = blk + 16;
    for (int j = 0; j < QK_K; j += 64, q += 32)
        for (int l = 0; l < 32; ++l) q[l] = L[j + l] | (uint8_t)(L[j + l + 32] << 4);
}

static void pack_q5_K(const uint8_t *L, uint8_t *blk) {
    uint8_t *qh = blk + 16, *ql = blk + 48;
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

int minfer_quantize_q4_K(const float *x, uint8_t *out, int64_t nsb) {
    quantize_min_type(x, out, nsb, 15, -1.f, 0.1f, 20, 144, pack_q4_K);
    return 0;
}

int minfer_quantize_q5_K(const float *x, uint8_t *out, int64_t nsb) {
    quantize_min_type(x, out, nsb, 31, -0.5f, 0.1f, 15, 176, pack_q5_K);
    return 0;
}

/* ---- q6_K ------------------------------------------------------------------------------- */

#define GROUP_MAX_EPS 1e-15f

/* make_qx_quants(16, nmax = 32, x, L, rmse_type = 1, qw = NULL) for LANES sub-blocks of 16.
 * x: [16][KI] (as make_qkx2). L: [16][KI] out, levels 0..63. scale: [KI] out (0 for all-zero
 * sub-blocks). */
static void make_qx(const vf (*x)[KI], vf (*L)[KI], vf *scale) {
    const int nmax = 32;
    vf w[16][KI], wx[16][KI], amax[KI], mx[KI], iscale[KI], sumlx[KI], suml2[KI], best[KI];
    vi zero[KI];
    for (int k = 0; k < KI; ++k) amax[k] = mx[k] = sumlx[k] = suml2[k] = (vf){0};
    for (int i = 0; i < 16; ++i)
        for (int k = 0; k < KI; ++k) {  /* the first value of largest |x|: `if (ax > amax)` */
            vf ax = vabs(x[i][k]);
            vi gt = ax > amax[k];
            amax[k] = sel(gt, ax, amax[k]);
            mx[k] = sel(gt, x[i][k], mx[k]);
            w[i][k] = x[i][k] * x[i][k];
            wx[i][k] = w[i][k] * x[i][k];  /* C: w*x[i]*l = (w*x)*l */
        }
    for (int k = 0; k < KI; ++k) {
        zero[k] = amax[k] < GROUP_MAX_EPS;  /* C returns 0 with L = 0 */
        iscale[k] = (float)(-nmax) / mx[k];
    }
    for (int i = 0; i < 16; ++i)
        for (int k = 0; k < KI; ++k) {
            vf l = levels(iscale[k] * x[i][k], -nmax, nmax - 1);
            L[i][k] = l + (float)nmax;
            sumlx[k] += wx[i][k] * l;
            suml2[k] += w[i][k] * l * l;
        }
    for (int k = 0; k < KI; ++k) {
        scale[k] = sel(suml2[k] != 0, sumlx[k] / suml2[k], (vf){0});
        best[k] = scale[k] * sumlx[k];
    }
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        const float num = -((float)nmax + 0.1f * (float)is);
        vf lv[16][KI];
        for (int k = 0; k < KI; ++k) {
            iscale[k] = num / mx[k];
            sumlx[k] = suml2[k] = (vf){0};
        }
        for (int i = 0; i < 16; ++i)
            for (int k = 0; k < KI; ++k) {
                lv[i][k] = levels(iscale[k] * x[i][k], -nmax, nmax - 1);
                sumlx[k] += wx[i][k] * lv[i][k];
                suml2[k] += w[i][k] * lv[i][k] * lv[i][k];
            }
        for (int k = 0; k < KI; ++k) {
            vi upd = (suml2[k] > 0) & (sumlx[k] * sumlx[k] > best[k] * suml2[k]);
            if (any(upd)) {
                for (int i = 0; i < 16; ++i) L[i][k] = sel(upd, lv[i][k] + (float)nmax, L[i][k]);
                scale[k] = sel(upd, sumlx[k] / suml2[k], scale[k]);
                best[k] = sel(upd, scale[k] * sumlx[k], best[k]);
            }
        }
    }
    for (int k = 0; k < KI; ++k) {
        if (any(zero[k]))
            for (int i = 0; i < 16; ++i) L[i][k] = sel(zero[k], (vf){0}, L[i][k]);
        scale[k] = sel(zero[k], (vf){0}, scale[k]);
    }
}

_Static_assert(16 % LANES == 0, "whole lane groups per q6_K super-block");

int minfer_quantize_q6_K(const float *xin, uint8_t *out, int64_t nsb) {
    for (int64_t b = 0; b < nsb; ++b, xin += QK_K, out += 210) {
        float scale[16];
        uint8_t Lb[QK_K];  /* [sub-block][16], levels 0..63 */
        for (int g = 0; g < 16; g += LANES) {  /* lanes: sub-blocks g .. g + LANES - 1 */
            vf x[16][KI], L[16][KI], sc[KI];
            for (int s = 0; s < LANES; ++s)
                for (int i = 0; i < 16; ++i) x[i][s / NL][s % NL] = xin[16 * (g + s) + i];
            make_qx(x, L, sc);
            for (int s = 0; s < LANES; ++s) {
                scale[g + s] = sc[s / NL][s % NL];
                for (int i = 0; i < 16; ++i) Lb[16 * (g + s) + i] = (uint8_t)L[i][s / NL][s % NL];
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
