// attention_tok.cu: causal GQA attention one query token per block (batched decode).
//
//   o[t, h, :] = softmax_j( cap(q[t, h, :] . k[j, h/G, :] * scale) ) v[j, h/G, :],
//   lo_t <= j <= slot_t and slot_t - j < window (window > 0; cap: tanh soft-cap, cap_s > 0)
//   q: f16 [T, Hq, D] (token stride ldq elements), k/v cache: f16 [S, Hkv, D] (S > slot_t),
//   o: f16 [T, Hq, D] (token stride ldo), G = Hq / Hkv, scale (1/sqrt(D) by
//   default) as scale_log2 = scale log2(e); window, cap_s: attention_common.cuh.
// The contract of attention.cu (same arguments, same tok convention: int2 [T] (slot, lo) per
// token, or null for (pos0 + t, 0)); numpy twin minfer.reference.ops.attention_packed; launcher
// minfer/cuda/ops/attention.py (impl "tok").
//
// Entries: attn_tok_d64, _d96, _d128, _d256 (head_dim).
// Why: the tile kernels put 128 (token, head) rows against each 128-key tile. In a decode step
// every token is its own sequence, so a tile's keys serve only the G rows of one token while
// the block scans the keys of all its sequences (64 sequences of ~200 keys: 2 blocks per KV
// head, each scanning ~8,000 keys for 128 rows). Here one block = one token x one KV head x up
// to TOK_G heads of its group (grid z covers larger groups): it reads the token's own keys
// lo..slot once. TOK_WARPS warps split them in runs of TOK_KC keys (loads in flight); a lane
// holds D / 32 elements of q, k, v and o per head, a score is a warp sum (xor butterfly, so
// every lane has it); each warp keeps its own online-softmax state (max, sum, o), combined
// through smem at the end. Everything in f32 (p is not rounded to f16 as in the tile kernels).
#include <cuda_fp16.h>
#include <stdint.h>

#include "attention_common.cuh"   // tok_at (window), softcap

#define TOK_WARPS 8
#define TOK_G 4    // query heads of the group per block (grid z: G > 4)
#define TOK_KC 4   // keys per warp step

static_assert(sizeof(__half2) == 4, "half2 is 4 bytes");

// E halves of row `p` as floats: E = 8 one 16-byte load, E = 4 one 8-byte load, E = 2 one
// 4-byte load; else (E = 3: head_dim 96, rows at 6-byte steps) one half at a time
template <int E>
__device__ __forceinline__ void load_row(float* f, const __half* p) {
    if constexpr (E == 8 || E == 4) {
        constexpr int W = E / 4;   // 8-byte words
        uint2 u[W];
        if constexpr (W == 2) {
            const uint4 w = *reinterpret_cast<const uint4*>(p);
            u[0] = make_uint2(w.x, w.y); u[1] = make_uint2(w.z, w.w);
        } else {
            u[0] = *reinterpret_cast<const uint2*>(p);
        }
#pragma unroll
        for (int i = 0; i < W; i++) {
            const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u[i].x));
            const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u[i].y));
            f[4 * i] = a.x; f[4 * i + 1] = a.y; f[4 * i + 2] = b.x; f[4 * i + 3] = b.y;
        }
    } else if constexpr (E == 2) {
        const float2 a = __half22float2(*reinterpret_cast<const __half2*>(p));
        f[0] = a.x; f[1] = a.y;
    } else {
#pragma unroll
        for (int e = 0; e < E; e++) f[e] = __half2float(p[e]);
    }
}

template <int D>
__device__ void attn_tok(const __half* __restrict__ q, long ldq, const __half* __restrict__ kc,
                         const __half* __restrict__ vc, __half* __restrict__ o, long ldo,
                         int Hq, int Hkv, int pos0, const int2* __restrict__ tok,
                         float scale_log2, int window, float cap_s) {
    constexpr int E = D / 32;   // elements of a row per lane
    __shared__ float s_m[TOK_WARPS][TOK_G], s_l[TOK_WARPS][TOK_G];
    __shared__ float s_o[TOK_WARPS][TOK_G][D];

    const int t = blockIdx.x, hk = blockIdx.y, G = Hq / Hkv;
    const int g0 = blockIdx.z * TOK_G, ng = min(TOK_G, G - g0);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int2 tk = tok_at(tok, pos0, t, window);
    const int last = tk.x;
    const long ldkv = (long)Hkv * D;
    const __half* kb = kc + (long)hk * D + lane * E;
    const __half* vb = vc + (long)hk * D + lane * E;

    float qr[TOK_G][E], oacc[TOK_G][E], m[TOK_G], l[TOK_G];
#pragma unroll
    for (int g = 0; g < TOK_G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < E; e++) qr[g][e] = oacc[g][e] = 0.f;
        if (g < ng) load_row<E>(qr[g], q + (long)t * ldq + (long)(hk * G + g0 + g) * D + lane * E);
    }

    for (int j0 = tk.y + warp * TOK_KC; j0 <= last; j0 += TOK_WARPS * TOK_KC) {
        float kr[TOK_KC][E], vr[TOK_KC][E];
#pragma unroll
        for (int c = 0; c < TOK_KC; c++) {   // keys past `last` read key j0 (in bounds), masked
            const long row = (long)(j0 + c <= last ? j0 + c : j0) * ldkv;
            load_row<E>(kr[c], kb + row);
            load_row<E>(vr[c], vb + row);
        }
#pragma unroll
        for (int g = 0; g < TOK_G; g++) {
            if (g >= ng) break;
            float s[TOK_KC];
#pragma unroll
            for (int c = 0; c < TOK_KC; c++) {
                float d = 0.f;
#pragma unroll
                for (int e = 0; e < E; e++) d = fmaf(qr[g][e], kr[c][e], d);
#pragma unroll
                for (int off = 16; off >= 1; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
                if (cap_s > 0.f) d = softcap(d, cap_s);
                s[c] = j0 + c <= last ? d : -INFINITY;
            }
            float mx = s[0];   // key j0 <= last: finite
#pragma unroll
            for (int c = 1; c < TOK_KC; c++) mx = fmaxf(mx, s[c]);
            const float mn = fmaxf(m[g], mx);
            const float corr = exp2f((m[g] - mn) * scale_log2);   // m -inf: 0
            m[g] = mn;
            float sum = 0.f, p[TOK_KC];
#pragma unroll
            for (int c = 0; c < TOK_KC; c++) {
                p[c] = exp2f((s[c] - mn) * scale_log2);
                sum += p[c];
            }
            l[g] = l[g] * corr + sum;
#pragma unroll
            for (int e = 0; e < E; e++) {
                float acc = oacc[g][e] * corr;
#pragma unroll
                for (int c = 0; c < TOK_KC; c++) acc = fmaf(p[c], vr[c][e], acc);
                oacc[g][e] = acc;
            }
        }
    }

    // combine the warps' states: a warp that saw no key has m = -inf, l = 0, o = 0
#pragma unroll
    for (int g = 0; g < TOK_G; g++) {
        if (g >= ng) break;
        if (lane == 0) { s_m[warp][g] = m[g]; s_l[warp][g] = l[g]; }
#pragma unroll
        for (int e = 0; e < E; e++) s_o[warp][g][lane * E + e] = oacc[g][e];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < ng * D; i += TOK_WARPS * 32) {
        const int g = i / D, d = i - g * D;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < TOK_WARPS; w++) mx = fmaxf(mx, s_m[w][g]);   // warp 0 saw key lo
        float lsum = 0.f, acc = 0.f;
#pragma unroll
        for (int w = 0; w < TOK_WARPS; w++) {
            const float c = exp2f((s_m[w][g] - mx) * scale_log2);
            lsum = fmaf(s_l[w][g], c, lsum);
            acc = fmaf(s_o[w][g][d], c, acc);
        }
        o[(long)t * ldo + (long)(hk * G + g0 + g) * D + d] = __float2half_rn(acc / lsum);
    }
}

// head_dim 256 holds 4 x 8 floats each of q, o, k and v per lane: one block per SM's share
// of registers (2 would cap them at 128 and spill)
#define TOK_ENTRY(DD, MINB)                                                                    \
    extern "C" __global__ void __launch_bounds__(TOK_WARPS * 32, MINB)                        \
        attn_tok_d##DD(const __half* q, long ldq, const __half* kc, const __half* vc,         \
                       __half* o, long ldo, int T, int Hq, int Hkv, int pos0, const int2* tok, \
                       float scale_log2, int window, float cap_s) {                           \
        (void)T;                                                                              \
        attn_tok<DD>(q, ldq, kc, vc, o, ldo, Hq, Hkv, pos0, tok, scale_log2, window, cap_s);  \
    }
TOK_ENTRY(64, 2)
TOK_ENTRY(96, 2)
TOK_ENTRY(128, 2)
TOK_ENTRY(256, 1)
