// layers.cu: the elementwise / row-wise layers of the llama forward (everything but GEMMs and
// attention). Numpy twins: minfer/reference/ops.py; launchers: minfer/cuda/ops/layers.py.
//
// Entries (all row-major, contiguous unless a leading dimension `ld*` is given, in elements):
//   rmsnorm_f32_f16 / rmsnorm_f32_f32  y[T, D] = x * (1/sqrt(mean(x^2) + eps)) * w
//       x f32 [T, ldx], w f32 [D]; one block per row; sum of squares in double (as ggml,
//       rmsnorm.cuh).
//   head_rmsnorm_f32                    in place on x [T, H, D] (row stride ldx per token):
//                                       each head's D values rmsnorm'd with w [D] (qwen3's
//                                       attn_q_norm / attn_k_norm); grid (T, H), block (128)
//   rope_f32 / rope_f16                 in place on x [T, H, D] (row stride ldx per token)
//   rope_f32_f16                        rope of f32 src into f16 dst (dst row stride ldd), e.g.
//                                       straight into the KV cache at row pos0; dims past
//                                       rope_dim are copied.
//       angles: cos/sin tables f32 [n_pos, rope_dim/2] indexed by absolute position pos0 + t,
//       computed on the host by the reference's formula (bit-identical angles).
//       neox=0: pairs (2i, 2i+1); neox=1: pairs (i, i + rope_dim/2).
//   rope_qkv_f32_f16                    one launch per layer for the attention inputs, token
//                                       layout read from the device (tok[t] = (slot, lo): a
//                                       captured CUDA graph serves every layout): q16 [T, Hq, D]
//                                       = rope(q) at position slot - lo, kc[slot] = rope(k),
//                                       vc[slot] = v, all f16; q/k/v
//                                       f32 rows of strides ldq/ldk/ldv (views into one fused
//                                       [T, (Hq + 2 Hkv) D] GEMM output, or three buffers).
//                                       grid (T, ceil((Hq + 2 Hkv) D/2 / 128)), block (128)
//   rope_qkv_f32_f16_v4                 the same, two pairs per thread (16-byte loads; D % 4 ==
//                                       rope_dim % 4 == 0, q/k/v rows 16-byte aligned)
//   rope_qkv_norm_f32_f16_v4            the same of q and k RMS-normalized first (each head, or
//                                       olmo2's whole row): head_rmsnorm then rope_qkv's bits in
//                                       one pass; D % 8 == 0; grid (T), block (128)
//   swiglu_f32_f16                      y f16 [T, F] = silu(g) * u, g/u f32 rows of stride ldg
//                                       (g = u - F, ldg = 2F: the fused gate|up GEMM output)
//   swiglu_f32_f16_v4                   the same, 4 columns per thread (F % 4 == 0, aligned)
//   add_f32                             y[n] += x[n]
//   copy_rows_u128                      in each buffer bufs[y] (u64 device addresses, grid.y
//                                       of them): bytes [src, src + n) copied to [dst, dst + n)
//                                       16 at a time (n, src, dst multiples of 16; the ranges
//                                       do not overlap): copy_kv's every layer in one launch
//   add_bias_f32                        y[T, N] += b[N] (qkv bias)
//   cvt_f32_f16                         dst f16 [T, W] (stride ldd) = src f32 [T, W] (stride lds);
//                                       the KV-cache append of V (dst = cache + pos0 * W)
//   argmax_f32                          out[0] = first index of the max of x[n] (one block)
//   rmsnorm_rows_f32_f16                rmsnorm of rows x[rows[i]] into y row i (grid (m))
//   rmsnorm_rows_f32_f32                the same into f32 y: pooled jobs' final hidden states
//   row_stats_f32                       per row i of logits [m, V]: stats[i] = (argmax (first
//                                       on ties), top1 - top2, logits[targets[i]] - logsumexp
//                                       (NaN when targets[i] < 0), logsumexp); grid (m), 1024
//                                       threads: greedy ids and prompt log-probs on the GPU, so
//                                       a batch never copies [m, V] logits to the host
//   row_topk_f32, row_topk{1,4}_f32     per row i of logits [m, V]: its k <= 20 (1, 4) largest logits
//                                       (value descending, then index ascending) -> ids
//                                       int32 [m, k] and log-probs f32 [m, k] = logit - lse[i]
//                                       (row_stats' logsumexp); grid (m), 512 threads: top
//                                       log-probs (echo / scoring), run only when asked
// Products that the reference rounds separately are written with __fmul_rn/__fadd_rn so the
// compiler does not contract them into FMAs (keeps GPU and numpy within an ulp).
#include <cuda_fp16.h>
#include <stdint.h>

#include "rmsnorm.cuh"  // rms_scale, rms_value
#include "swiglu.cuh"   // swiglu1
#include "rope.cuh"     // rope_rot

static_assert(sizeof(__half) == 2, "f16 is 2 bytes");

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }

// ---- rmsnorm: grid (T), block (256) ---------------------------------------------------------
// rms_scale (rmsnorm.cuh) reads the row with 16-byte loads in its fixed summation order; the
// output pass reads it again (L1) and writes 4 values per thread where everything is aligned.
// (The first version read one float per thread and step, both passes: 14.3 us on [512, 4096],
// latency-bound.)
template <typename OutT> __device__ __forceinline__ void store4(OutT* y, const float (&v)[4]);
template <> __device__ __forceinline__ void store4<float>(float* y, const float (&v)[4]) {
    *reinterpret_cast<float4*>(y) = make_float4(v[0], v[1], v[2], v[3]);
}
template <> __device__ __forceinline__ void store4<__half>(__half* y, const float (&v)[4]) {
    const __half2 a = __floats2half2_rn(v[0], v[1]), b = __floats2half2_rn(v[2], v[3]);
    *reinterpret_cast<uint2*>(y) =
        make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
}

template <typename OutT>
__device__ void rmsnorm_row(OutT* __restrict__ y, int ldy, const float* __restrict__ x, int ldx,
                            const float* __restrict__ w, int D, float eps,
                            const int* __restrict__ rows = nullptr) {
    const float* xr = x + (size_t)(rows != nullptr ? rows[blockIdx.x] : blockIdx.x) * ldx;
    OutT* yr = y + (size_t)blockIdx.x * ldy;
    const float scale = rms_scale(xr, D, eps);
    const bool vec = (D & 3) == 0 && ((uintptr_t)xr & 15) == 0 && ((uintptr_t)w & 15) == 0 &&
                     ((uintptr_t)yr & (4 * sizeof(OutT) - 1)) == 0;
    if (vec) {
#pragma unroll 4
        for (int p = threadIdx.x; p < D / 4; p += blockDim.x) {
            const float4 a = reinterpret_cast<const float4*>(xr)[p];
            const float4 b = reinterpret_cast<const float4*>(w)[p];
            const float v[4] = {rms_value(a.x, scale, b.x), rms_value(a.y, scale, b.y),
                                rms_value(a.z, scale, b.z), rms_value(a.w, scale, b.w)};
            store4<OutT>(yr + 4 * p, v);
        }
    } else {
        for (int i = threadIdx.x; i < D; i += blockDim.x)
            yr[i] = from_f<OutT>(rms_value(xr[i], scale, w[i]));
    }
}

extern "C" __global__ void rmsnorm_f32_f16(__half* y, int ldy, const float* x, int ldx,
                                           const float* w, int D, float eps) {
    rmsnorm_row<__half>(y, ldy, x, ldx, w, D, eps);
}
// y row i = rmsnorm(x row rows[i]): the rows of a packed batch that need logits, gathered
extern "C" __global__ void rmsnorm_rows_f32_f16(__half* y, int ldy, const float* x, int ldx,
                                                const int* rows, const float* w, int D,
                                                float eps) {
    rmsnorm_row<__half>(y, ldy, x, ldx, w, D, eps, rows);
}
extern "C" __global__ void rmsnorm_f32_f32(float* y, int ldy, const float* x, int ldx,
                                           const float* w, int D, float eps) {
    rmsnorm_row<float>(y, ldy, x, ldx, w, D, eps);
}
// f32 rows for embeddings / label logits: no f16 rounding of the hidden state handed out
extern "C" __global__ void rmsnorm_rows_f32_f32(float* y, int ldy, const float* x, int ldx,
                                                const int* rows, const float* w, int D,
                                                float eps) {
    rmsnorm_row<float>(y, ldy, x, ldx, w, D, eps, rows);
}

// ---- head_rmsnorm: grid (T, H), block (128) ----------------------------------------------------
// In place is safe: rms_scale's last __syncthreads (rms_finish) follows every read of the row.
extern "C" __global__ void head_rmsnorm_f32(float* x, long ldx, int D, const float* w, float eps) {
    float* xr = x + (size_t)blockIdx.x * ldx + (size_t)blockIdx.y * D;
    const float scale = rms_scale(xr, D, eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x) xr[i] = rms_value(xr[i], scale, w[i]);
}

// ---- rope: grid (T, ceil(H*D/2 / 128)), block (128): one thread per (head, pair) ---------------
template <typename InT, typename OutT>
__device__ void rope_body(OutT* dst, long ldd, const InT* src, long lds, int H, int D,
                          int rope_dim, int neox, const float* __restrict__ cos_t,
                          const float* __restrict__ sin_t, int pos0) {
    const int t = blockIdx.x;
    const int half_d = D >> 1;
    const int idx = blockIdx.y * blockDim.x + threadIdx.x;  // (head, pair) flattened
    if (idx >= H * half_d) return;
    const int h = idx / half_d, p = idx - h * half_d;
    const InT* s = src + t * lds + (long)h * D;
    OutT* d = dst + t * ldd + (long)h * D;
    const int half_r = rope_dim >> 1;
    int i0, i1;
    if (p < half_r) {
        if (neox) { i0 = p; i1 = p + half_r; } else { i0 = 2 * p; i1 = 2 * p + 1; }
        const float c = cos_t[(long)(pos0 + t) * half_r + p];
        const float sn = sin_t[(long)(pos0 + t) * half_r + p];
        const float a = to_f(s[i0]), b = to_f(s[i1]);
        const float ya = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, sn));
        const float yb = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, c));
        d[i0] = from_f<OutT>(ya);
        d[i1] = from_f<OutT>(yb);
    } else {  // pass-through pair past rope_dim
        i0 = 2 * p; i1 = 2 * p + 1;
        d[i0] = from_f<OutT>(to_f(s[i0]));
        d[i1] = from_f<OutT>(to_f(s[i1]));
    }
}

extern "C" __global__ void rope_f32(float* x, long ldx, int H, int D, int rope_dim, int neox,
                                    const float* cos_t, const float* sin_t, int pos0) {
    rope_body<float, float>(x, ldx, x, ldx, H, D, rope_dim, neox, cos_t, sin_t, pos0);
}
extern "C" __global__ void rope_f16(__half* x, long ldx, int H, int D, int rope_dim, int neox,
                                    const float* cos_t, const float* sin_t, int pos0) {
    rope_body<__half, __half>(x, ldx, x, ldx, H, D, rope_dim, neox, cos_t, sin_t, pos0);
}
extern "C" __global__ void rope_f32_f16(__half* dst, long ldd, const float* src, long lds, int H,
                                        int D, int rope_dim, int neox, const float* cos_t,
                                        const float* sin_t, int pos0) {
    rope_body<float, __half>(dst, ldd, src, lds, H, D, rope_dim, neox, cos_t, sin_t, pos0);
}

// ---- fused rope of q and k + KV-cache append of k and v (device-side pos0) --------------------
// A q or k row as the rope reads it: s[i], or (NORM: rope_qkv_norm's fused q/k norm) s[i]
// rms_value'd with the head's (or the whole row's) scale and weight: head_rmsnorm's value, bit
// for bit, without its in-place pass over q and k.
template <bool NORM> struct RopeSrc {
    const float* s;
    const float* w;   // NORM: the weight from this head's first element on
    float sc;         // NORM: the rms scale
    __device__ __forceinline__ float at(int i) const {
        if constexpr (NORM) return rms_value(s[i], sc, w[i]);
        else return s[i];
    }
    __device__ __forceinline__ float2 at2(int i) const {
        float2 x = *reinterpret_cast<const float2*>(s + i);
        if constexpr (NORM) {
            const float2 v = *reinterpret_cast<const float2*>(w + i);
            x = make_float2(rms_value(x.x, sc, v.x), rms_value(x.y, sc, v.y));
        }
        return x;
    }
    __device__ __forceinline__ float4 at4(int i) const {
        float4 x = *reinterpret_cast<const float4*>(s + i);
        if constexpr (NORM) {
            const float4 v = *reinterpret_cast<const float4*>(w + i);
            x = make_float4(rms_value(x.x, sc, v.x), rms_value(x.y, sc, v.y),
                            rms_value(x.z, sc, v.z), rms_value(x.w, sc, v.w));
        }
        return x;
    }
};

// pair p of a head (rope_qkv_f32_f16: a thread per pair, grid (T, ceil((Hq + 2 Hkv) D/2 / 128)),
// block (128))
template <bool NORM>
__device__ __forceinline__ void rope_pair_f16(__half* d, const RopeSrc<NORM>& s, int p,
                                              int half_r, int neox, const float* cr,
                                              const float* sr) {
    int i0, i1;
    if (p < half_r) {
        if (neox) { i0 = p; i1 = p + half_r; } else { i0 = 2 * p; i1 = 2 * p + 1; }
        const float2 y = rope_rot(s.at(i0), s.at(i1), cr[p], sr[p]);
        d[i0] = __float2half_rn(y.x);
        d[i1] = __float2half_rn(y.y);
    } else {  // pass-through pair past rope_dim
        d[2 * p] = __float2half_rn(s.at(2 * p));
        d[2 * p + 1] = __float2half_rn(s.at(2 * p + 1));
    }
}

// rope_qkv_f32_f16_v4, two pairs per thread: elements 4g .. 4g+3 of a head (non-neox: pairs 2g,
// 2g + 1; neox: pairs 2g, 2g + 1 at (2g, 2g + 1) and (2g + half_r, 2g + 1 + half_r); past
// rope_dim: elements 4g .. 4g+3 copied), 16-byte f32 loads (8-byte neox), 8-byte f16 stores,
// bit-identical to the scalar kernel. The launcher picks it when D % 4 == rope_dim % 4 == 0 and
// the q/k/v rows are 16-byte aligned. grid (T, ceil((Hq + 2 Hkv) D/4 / 128)), block (128)
template <bool NORM>
__device__ __forceinline__ void rope_quad_f16(__half* d, const RopeSrc<NORM>& s, int g,
                                              int half_r, int neox, const float* cr,
                                              const float* sr) {
    if (2 * g >= half_r) {   // pass-through (rope_dim % 4 == 0: no group straddles it)
        const float4 x = s.at4(4 * g);
        __half2 h[2] = {__floats2half2_rn(x.x, x.y), __floats2half2_rn(x.z, x.w)};
        *reinterpret_cast<uint2*>(d + 4 * g) = *reinterpret_cast<uint2*>(h);
        return;
    }
    const float2 c = *reinterpret_cast<const float2*>(cr + 2 * g);
    const float2 sn = *reinterpret_cast<const float2*>(sr + 2 * g);
    if (neox) {
        const float2 a = s.at2(2 * g);
        const float2 b = s.at2(2 * g + half_r);
        const float2 y0 = rope_rot(a.x, b.x, c.x, sn.x), y1 = rope_rot(a.y, b.y, c.y, sn.y);
        *reinterpret_cast<__half2*>(d + 2 * g) = __floats2half2_rn(y0.x, y1.x);
        *reinterpret_cast<__half2*>(d + 2 * g + half_r) = __floats2half2_rn(y0.y, y1.y);
    } else {
        const float4 x = s.at4(4 * g);
        const float2 y0 = rope_rot(x.x, x.y, c.x, sn.x), y1 = rope_rot(x.z, x.w, c.y, sn.y);
        __half2 h[2] = {__floats2half2_rn(y0.x, y0.y), __floats2half2_rn(y1.x, y1.y)};
        *reinterpret_cast<uint2*>(d + 4 * g) = *reinterpret_cast<uint2*>(h);
    }
}

// The q/k norms' scales (rope_qkv_norm): full, two (q's row, k's row: rms_scale with the
// block's 128 threads, head_rmsnorm's H = 1 order); else one a head (sc[0 .. Hq) q's, then k's:
// a warp a head, lane l summing values 8 l .. 8 l + 7 of each 256-value chunk in turn, then
// rms_finish's shuffle tree: at D <= 256 head_rmsnorm's order, whose other warps add zeros).
// Needs D % 8 == 0 and 16-byte aligned rows (the launcher checks).
constexpr int ROPE_NORM_HEADS = 256;   // Hq + Hkv at most, per-head norms
__device__ void qk_norm_scales(float* sc, const float* q, const float* k, int Hq, int Hkv, int D,
                               float eps, int full) {
    if (full) {
        const float a = rms_scale(q, Hq * D, eps);
        __syncthreads();   // (rms_finish's shared sum is read by every thread: reuse after)
        const float b = rms_scale(k, Hkv * D, eps);
        if (threadIdx.x == 0) { sc[0] = a; sc[1] = b; }
    } else {
        const int warps = blockDim.x >> 5, l = threadIdx.x & 31;
        for (int h = threadIdx.x >> 5; h < Hq + Hkv; h += warps) {
            const float* r = h < Hq ? q + (long)h * D : k + (long)(h - Hq) * D;
            double s = 0.0;
            for (int c = 0; c < (D + 255) / 256; ++c) {
                float x[8];
                rms_load8(r, D, c, l, x);
                s = rms_chunk_sum(s, x);
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (l == 0) sc[h] = (float)(1.0 / sqrt(s / D + (double)eps));
        }
    }
    __syncthreads();
}

// Both entries: W elements (W / 2 pairs) per thread, W = 2 (rope_qkv_f32_f16) or 4 (_v4); the
// two-entry body compiles to the same PTX as two hand-written kernels. Items idx .. step
// gridDim.y x blockDim.x: one each for rope_qkv's grid, all of the token's for rope_qkv_norm's
// block a token. NORM: q and k normalized on the way in (wq [Hq D] / wk [Hkv D] for full
// norms, else [D]; sc: qk_norm_scales').
template <int W, bool NORM>
__device__ __forceinline__ void rope_qkv_body(__half* __restrict__ q16,
                                              const float* __restrict__ qs, long ldq,
                                              const float* __restrict__ ks, long ldk,
                                              const float* __restrict__ vs, long ldv,
                                              __half* __restrict__ kc, __half* __restrict__ vc,
                                              int Hq, int Hkv, int D, int rope_dim, int neox,
                                              const float* __restrict__ cos_t,
                                              const float* __restrict__ sin_t,
                                              const int2* __restrict__ tok,
                                              const float* wq = nullptr,
                                              const float* wk = nullptr,
                                              const float* sc = nullptr, int full = 0) {
    const int t = blockIdx.x;
    const int groups = D >> (W == 2 ? 1 : 2), half_r = rope_dim >> 1;   // D / W
    const int nq = Hq * groups, nk = Hkv * groups;
    const int2 tp = tok[t];   // (KV slot, its sequence's first slot): position slot - lo
    const long p_abs = tp.x;
    const float* cr = cos_t + (long)(tp.x - tp.y) * half_r;
    const float* sr = sin_t + (long)(tp.x - tp.y) * half_r;
    auto rope = [&](__half* d, const RopeSrc<NORM>& s, int g) {
        if constexpr (W == 2) rope_pair_f16<NORM>(d, s, g, half_r, neox, cr, sr);
        else rope_quad_f16<NORM>(d, s, g, half_r, neox, cr, sr);
    };
    // (part, head, group) flattened
    for (int idx = blockIdx.y * blockDim.x + threadIdx.x; idx < nq + 2 * nk;
         idx += gridDim.y * blockDim.x) {
        if (idx < nq) {
            const int h = idx / groups, g = idx - h * groups;
            RopeSrc<NORM> s{qs + t * ldq + (long)h * D, nullptr, 0.f};
            if constexpr (NORM) {
                s.w = full ? wq + (long)h * D : wq;
                s.sc = full ? sc[0] : sc[h];
            }
            rope(q16 + ((long)t * Hq + h) * D, s, g);
        } else if (idx < nq + nk) {
            const int j = idx - nq, h = j / groups, g = j - h * groups;
            RopeSrc<NORM> s{ks + t * ldk + (long)h * D, nullptr, 0.f};
            if constexpr (NORM) {
                s.w = full ? wk + (long)h * D : wk;
                s.sc = full ? sc[1] : sc[Hq + h];
            }
            rope(kc + (p_abs * Hkv + h) * D, s, g);
        } else {
            const int j = idx - nq - nk;  // v: plain f32 -> f16 copy of elements W j .. W j + W - 1
            if constexpr (W == 2) {
                const float2 v = *reinterpret_cast<const float2*>(vs + t * ldv + 2 * j);
                *reinterpret_cast<__half2*>(vc + p_abs * Hkv * D + 2 * j) =
                    __floats2half2_rn(v.x, v.y);
            } else {
                const float4 v = *reinterpret_cast<const float4*>(vs + t * ldv + 4 * j);
                __half2 h[2] = {__floats2half2_rn(v.x, v.y), __floats2half2_rn(v.z, v.w)};
                *reinterpret_cast<uint2*>(vc + p_abs * Hkv * D + 4 * j) =
                    *reinterpret_cast<uint2*>(h);
            }
        }
    }
}

#define ROPE_QKV_ARGS                                                                          \
    __half *__restrict__ q16, const float *__restrict__ qs, long ldq,                          \
        const float *__restrict__ ks, long ldk, const float *__restrict__ vs, long ldv,        \
        __half *__restrict__ kc, __half *__restrict__ vc, int Hq, int Hkv, int D, int rope_dim, \
        int neox, const float *__restrict__ cos_t, const float *__restrict__ sin_t,            \
        const int2 *__restrict__ tok
#define ROPE_QKV_PASS q16, qs, ldq, ks, ldk, vs, ldv, kc, vc, Hq, Hkv, D, rope_dim, neox, cos_t, \
    sin_t, tok
extern "C" __global__ void rope_qkv_f32_f16(ROPE_QKV_ARGS) {
    rope_qkv_body<2, false>(ROPE_QKV_PASS);
}
extern "C" __global__ void rope_qkv_f32_f16_v4(ROPE_QKV_ARGS) {
    rope_qkv_body<4, false>(ROPE_QKV_PASS);
}
// rope_qkv_norm_f32_f16_v4: rope_qkv_f32_f16_v4 of q and k RMS-normalized first (qwen3 / gemma3:
// each head, wq / wk [D]; olmo2 full: all heads as one row, wq [Hq D], wk [Hkv D]), in one
// launch: head_rmsnorm twice then rope_qkv, bit for bit, reading q and k once from memory
// (the scales' pass leaves the row in L1 / L2). grid (T), block (128): a block a token.
extern "C" __global__ void __launch_bounds__(128)
rope_qkv_norm_f32_f16_v4(ROPE_QKV_ARGS, const float* __restrict__ wq,
                         const float* __restrict__ wk, float eps, int full) {
    __shared__ float sc[ROPE_NORM_HEADS];
    const int t = blockIdx.x;
    qk_norm_scales(sc, qs + t * ldq, ks + t * ldk, Hq, Hkv, D, eps, full);
    rope_qkv_body<4, true>(ROPE_QKV_PASS, wq, wk, sc, full);
}
#undef ROPE_QKV_PASS
#undef ROPE_QKV_ARGS

// ---- swiglu: grid (ceil(F/256), T), block (256) ----------------------------------------------

extern "C" __global__ void swiglu_f32_f16(__half* y, long ldy, const float* g, const float* u,
                                          long ldg, int F) {
    glu_rows_f32_f16<0>(y, ldy, g, u, ldg, F);
}

// same function, 4 columns per thread (16-byte loads, 8-byte stores); the launcher picks it when
// F, ldy, ldg are multiples of 4 and g, u, y are 16/16/8-byte aligned. grid (ceil(F/1024), T)
extern "C" __global__ void swiglu_f32_f16_v4(__half* y, long ldy, const float* g, const float* u,
                                             long ldg, int F) {
    const int t = blockIdx.y;
    const int i = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= F) return;
    const float4 gv = *reinterpret_cast<const float4*>(g + t * ldg + i);
    const float4 uv = *reinterpret_cast<const float4*>(u + t * ldg + i);
    __half2* d = reinterpret_cast<__half2*>(y + t * ldy + i);
    d[0] = __floats2half2_rn(swiglu1(gv.x, uv.x), swiglu1(gv.y, uv.y));
    d[1] = __floats2half2_rn(swiglu1(gv.z, uv.z), swiglu1(gv.w, uv.w));
}

// ---- add / convert ------------------------------------------------------------------------
extern "C" __global__ void add_f32(float* y, const float* x, long n) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __fadd_rn(y[i], x[i]);
}

// grid (min(ceil(n/16/256), 1024), buffers), block (256)
extern "C" __global__ void copy_rows_u128(const unsigned long long* bufs, long src, long dst,
                                          long n) {
    char* base = reinterpret_cast<char*>(bufs[blockIdx.y]);
    const int4* s = reinterpret_cast<const int4*>(base + src);
    int4* d = reinterpret_cast<int4*>(base + dst);
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n / 16;
         i += (long)gridDim.x * blockDim.x)
        d[i] = s[i];
}

// grid (ceil(W/256), T), block (256)
extern "C" __global__ void cvt_f32_f16(__half* dst, long ldd, const float* src, long lds, int W) {
    const int t = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < W) dst[t * ldd + i] = __float2half_rn(src[t * lds + i]);
}

// ---- argmax: grid (1), block (1024); ties -> first index; NaN never wins ----------------------
extern "C" __global__ void argmax_f32(int* out, const float* x, int n) {
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = x[i];
        if (v > best || (v == best && i < bi)) { best = v; bi = i; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
    }
    __shared__ float sv[32];
    __shared__ int si[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) { sv[warp] = best; si[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        const int nw = blockDim.x >> 5;
        best = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
        }
        if (lane == 0) out[0] = bi == 0x7fffffff ? 0 : bi;
    }
}

// ---- bias: y[T, N] += b[N]; grid (ceil(N/256), T), block (256) --------------------------------
extern "C" __global__ void add_bias_f32(float* y, const float* b, int N) {
    const int t = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) y[(long)t * N + i] = __fadd_rn(y[(long)t * N + i], b[i]);
}

// ---- row_stats: grid (m), block (1024) --------------------------------------------------------
// (best, index, second) of a row merged pairwise; on equal values the smaller index wins and the
// other value is the second (a tie has margin 0, as numpy's partition gives)
struct Top2 {
    float v1, v2;
    int i1;
};
__device__ __forceinline__ Top2 top2_merge(Top2 a, Top2 b) {
    const bool b_wins = b.v1 > a.v1 || (b.v1 == a.v1 && b.i1 < a.i1);
    const Top2 w = b_wins ? b : a, l = b_wins ? a : b;
    return Top2{w.v1, fmaxf(w.v2, l.v1), w.i1};
}
extern "C" __global__ void __launch_bounds__(1024)
row_stats_f32(float* stats, const float* logits, const int* targets, int V) {
    const float* x = logits + (size_t)blockIdx.x * V;
    __shared__ Top2 st[32];
    __shared__ float ss[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    Top2 t{-INFINITY, -INFINITY, 0x7fffffff};
    for (int i = threadIdx.x; i < V; i += blockDim.x) t = top2_merge(t, Top2{x[i], -INFINITY, i});
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        t = top2_merge(t, Top2{__shfl_xor_sync(0xffffffffu, t.v1, o),
                               __shfl_xor_sync(0xffffffffu, t.v2, o),
                               __shfl_xor_sync(0xffffffffu, t.i1, o)});
    if (lane == 0) st[warp] = t;
    __syncthreads();
    if (warp == 0) {
        t = lane < nw ? st[lane] : Top2{-INFINITY, -INFINITY, 0x7fffffff};
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            t = top2_merge(t, Top2{__shfl_xor_sync(0xffffffffu, t.v1, o),
                                   __shfl_xor_sync(0xffffffffu, t.v2, o),
                                   __shfl_xor_sync(0xffffffffu, t.i1, o)});
        if (lane == 0) st[0] = t;
    }
    __syncthreads();
    const float mx = st[0].v1;
    float s = 0.f;   // sum of exp(x - max), f32 (the twin sums in f64: within 1e-6 relative)
    for (int i = threadIdx.x; i < V; i += blockDim.x) s += expf(x[i] - mx);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) ss[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float tot = 0.f;
        for (int w = 0; w < nw; ++w) tot += ss[w];
        const float lse = mx + logf(tot);
        const int tg = targets[blockIdx.x];
        float* o = stats + 4 * (size_t)blockIdx.x;
        o[0] = (float)st[0].i1;
        o[1] = st[0].v1 - st[0].v2;
        o[2] = tg >= 0 && tg < V ? x[tg] - lse : __int_as_float(0x7fc00000);
        o[3] = lse;
    }
}

// ---- row_topk: grid (m), block (TOPK_THREADS) --------------------------------------------------
// The k <= TOPK_W best entries of a row in the order (value descending, then index ascending),
// NaN never among them. Pass 1: each thread keeps the TOPK_W best of its strided slice, sorted,
// in registers (a candidate is compared with the list's last, then bubbled up). Pass 2: k rounds
// of a block argmax over the threads' list heads; the thread holding the winner pops its head.
// Exact: each of the row's k best is among its own slice's TOPK_W >= k best, and the order is
// total on (value, index), so the result does not depend on the slice layout or the order in
// which a thread reads its slice. The empty slot (-inf, INT_MAX) loses to every real entry,
// -inf logits included (a soft cap's or a mask's), so a row of fewer than k finite logits still
// gets its -inf entries by index; only a row with fewer than k non-NaN logits shows an empty
// slot, written as id -1, log-prob NaN.
#define TOPK_W 20          // entries per thread's list = ops.TOP_MAX, the largest k
#define TOPK_THREADS 512   // 2 x 20 list registers + loop state fit 128 registers: no spills
#define TOPK_NONE 0x7fffffff

__device__ __forceinline__ bool topk_before(float v, int i, float w, int j) {
    return v > w || (v == w && i < j);   // false whenever v is NaN: a NaN is never kept
}

template <int W>
__device__ __forceinline__ void topk_push(float (&lv)[W], int (&li)[W], float v, int i) {
    if (!topk_before(v, i, lv[W - 1], li[W - 1])) return;
    lv[W - 1] = v;
    li[W - 1] = i;
#pragma unroll
    for (int j = W - 1; j > 0; --j) {   // static indices: the list stays in registers
        if (!topk_before(lv[j], li[j], lv[j - 1], li[j - 1])) break;
        const float tv = lv[j]; lv[j] = lv[j - 1]; lv[j - 1] = tv;
        const int ti = li[j]; li[j] = li[j - 1]; li[j - 1] = ti;
    }
}

__device__ __forceinline__ void topk_warp_best(float& v, int& i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {   // every lane ends with the warp's best (a total order)
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (topk_before(ov, oi, v, i)) { v = ov; i = oi; }
    }
}

// W >= k: a thread's list length (k = 1, the lm-eval case, keeps one entry: no insertion chain).
// ids int32 [m, k], lp f32 [m, k] (row stride k); logits f32 [m, V]; lse: row i's logsumexp at
// lse[i * lds] (lds 4: row_stats' column 3); lp = logit - lse rounded once in f32 (the twin's)
template <int W>
__device__ __forceinline__ void row_topk(int* ids, float* lp, const float* __restrict__ logits,
                                         const float* __restrict__ lse, int lds, int V, int k) {
    const float* x = logits + (size_t)blockIdx.x * V;
    float lv[W];
    int li[W];
#pragma unroll
    for (int j = 0; j < W; ++j) { lv[j] = -INFINITY; li[j] = TOPK_NONE; }
    if ((V & 3) == 0 && ((uintptr_t)logits & 15) == 0) {   // every row 16-byte aligned
        const float4* x4 = reinterpret_cast<const float4*>(x);
        for (int p = threadIdx.x; p < (V >> 2); p += blockDim.x) {
            const float4 q = x4[p];
            topk_push<W>(lv, li, q.x, 4 * p);
            topk_push<W>(lv, li, q.y, 4 * p + 1);
            topk_push<W>(lv, li, q.z, 4 * p + 2);
            topk_push<W>(lv, li, q.w, 4 * p + 3);
        }
    } else {
        for (int i = threadIdx.x; i < V; i += blockDim.x) topk_push<W>(lv, li, x[i], i);
    }
    __shared__ float rv[32];
    __shared__ int ri[32];
    __shared__ int win;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const float l = lse[(size_t)blockIdx.x * lds];
    int* orow = ids + (size_t)blockIdx.x * k;
    float* prow = lp + (size_t)blockIdx.x * k;
    for (int r = 0; r < k; ++r) {
        float v = lv[0];
        int i = li[0];
        topk_warp_best(v, i);
        if (lane == 0) { rv[warp] = v; ri[warp] = i; }
        __syncthreads();   // (also: every thread has read the previous round's `win`)
        if (warp == 0) {
            v = lane < nw ? rv[lane] : -INFINITY;
            i = lane < nw ? ri[lane] : TOPK_NONE;
            topk_warp_best(v, i);
            if (lane == 0) {
                win = i;
                orow[r] = i == TOPK_NONE ? -1 : i;
                prow[r] = i == TOPK_NONE ? __int_as_float(0x7fc00000) : __fsub_rn(v, l);
            }
        }
        __syncthreads();   // (also: warp 0 has read rv / ri before the next round writes them)
        if (li[0] == win && win != TOPK_NONE) {   // indices are distinct: one owner pops
#pragma unroll
            for (int j = 0; j < W - 1; ++j) { lv[j] = lv[j + 1]; li[j] = li[j + 1]; }
            lv[W - 1] = -INFINITY;
            li[W - 1] = TOPK_NONE;
        }
    }
}
#define TOPK_ENTRY(NAME, W)                                                                     \
    extern "C" __global__ void __launch_bounds__(TOPK_THREADS)                                  \
    NAME(int* ids, float* lp, const float* __restrict__ logits, const float* __restrict__ lse,  \
         int lds, int V, int k) {                                                                \
        row_topk<W>(ids, lp, logits, lse, lds, V, k);                                           \
    }
TOPK_ENTRY(row_topk1_f32, 1)
TOPK_ENTRY(row_topk4_f32, 4)
TOPK_ENTRY(row_topk_f32, TOPK_W)

