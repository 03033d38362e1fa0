// attention.cu: causal GQA flash attention over the f16 KV cache (prefill and decode).
//
//   o[t, h, :] = softmax_j( cap(q[t, h, :] . k[j, h/G, :] * scale) ) v[j, h/G, :],
//   lo_t <= j <= slot_t and slot_t - j < window (window > 0; cap: tanh soft-cap, cap_s > 0)
//   q: f16 [T, Hq, D] (token stride ldq elements), k/v cache: f16 [S, Hkv, D] (S > slot_t),
//   o: f16 [T, Hq, D] (token stride ldo), G = Hq / Hkv, scale (1/sqrt(D) by
//   default) as scale_log2 = scale log2(e); window, cap_s: attention_common.cuh.
// Numpy twin: minfer.reference.ops.attention (packed: ops.attention_packed); launcher:
// minfer/cuda/ops/attention.py.
//
// Entries: attn_fwd_d64, _d96, _d128, _d256 (head_dim; _d256 only in builds of at most 4 warps x
// 64 keys, the launcher's pick_geometry for it: 8 x 128 would spill its registers and need
// 270 KB of smem for the two stages of K and V tiles). tok: int2 [T] (slot, lo) per query
// token, read on the device (so a captured CUDA graph serves every layout): the token's own KV
// slot and its sequence's first slot, so packed prompts never attend across each other (the
// varlen convention). slot and lo must be non-decreasing in t (the engine lays sequences out
// in order). tok null: slot = pos0 + t, lo = 0 (one sequence, the host's pos0).
// Structure (FlashAttention-2 style): one block = one KV head x ATT_ROWS "rows", a row being a
// (token, query head of the group) pair flattened as r = t * G + g, so the G heads sharing a KV
// head share each K/V tile load, and decode (T = 1) still fills G rows of the tile. ATT_WARPS
// warps (8), 16 rows each. Loop over ATT_KEYS-key tiles (128) of the cache (8 x 128 ran 20%
// faster than 4 x 64 at the 8B shape: each tile load feeds twice the rows, and the softmax
// bookkeeping is spread over twice the keys; cp.async into padded smem, zero-filled past
// the last key the block may see), two stages: tile kt+1's K and V are in flight while tile kt
// is computed. S = Q K^T and O += P V on mma.sync m16n8k16 (f16 operands, f32 accumulate),
// online softmax in f32 with exp2, the causal mask only on the diagonal tiles. P goes from the
// S accumulators to the A fragments of the PV mma without touching smem. Blocks are issued
// last rows first (causal: the last rows see the most keys), so the long blocks start early.
#include <cuda_fp16.h>
#include <stdint.h>

#include "attention_common.cuh"   // tok_at (window), softcap

// Geometry (build options; the launcher, minfer/cuda/ops/attention.py AttnGeometry, sizes the grid
// and smem from the same values): ATT_WARPS warps of 16 rows, ATT_KEYS keys per K/V tile.
#ifndef ATT_WARPS
#define ATT_WARPS 8
#endif
#ifndef ATT_KEYS
#define ATT_KEYS 128   // keys per K/V tile
#endif
#define ATT_ROWS (ATT_WARPS * 16)   // rows (token x group-head pairs) per block
#define ATT_PAD 8     // halves of padding per smem row: 16 B, kills ldmatrix bank conflicts
static_assert(ATT_KEYS % 16 == 0 && ATT_ROWS <= 2 * ATT_KEYS, "Q is staged through 2 K tiles");

static_assert(sizeof(__half) == 2, "f16 is 2 bytes");

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cp_async16(void* sdst, const void* gsrc, bool valid) {
    const int n = valid ? 16 : 0;  // src-size 0: zero-fill the 16 bytes
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(sdst)),
                 "l"(gsrc), "r"(n));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                        const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                          const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(smem_u32(p)));
}
__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}

// Copy a [64 rows x D] f16 tile into smem (row stride D + ATT_PAD). Row i comes from
// base + i * ld_row unless i >= n_valid (then zero-filled).
template <int D>
__device__ __forceinline__ void load_kv_tile(__half* s, const __half* base, long ld_row,
                                             int n_valid) {
    constexpr int CH = D / 8;  // 16-byte chunks per row
#pragma unroll
    for (int c = threadIdx.x; c < ATT_KEYS * CH; c += ATT_WARPS * 32) {
        const int i = c / CH, j = c - i * CH;
        const bool ok = i < n_valid;
        const __half* src = ok ? base + (long)i * ld_row + j * 8 : base;
        cp_async16(s + i * (D + ATT_PAD) + j * 8, src, ok);
    }
}

template <int D>
__device__ void attn_fwd(const __half* __restrict__ q, long ldq, const __half* __restrict__ kc,
                         const __half* __restrict__ vc, __half* __restrict__ o, long ldo, int T,
                         int Hq, int Hkv, int pos0, const int2* __restrict__ tok,
                         float scale_log2, int window, float cap_s) {
    static_assert(D % 16 == 0 && D <= 256, "head_dim must be a multiple of 16, at most 256");
    constexpr int LDS = D + ATT_PAD;
    constexpr int KSTEPS = D / 16;   // k-steps of QK^T
    constexpr int DT = D / 8;        // n-tiles of O
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // stage st: K at st * 2 * TILE, V after it; [64][LDS] each; stage 0's K holds Q first
    constexpr int TILE = ATT_KEYS * LDS;
    __half* sK = reinterpret_cast<__half*>(smem_raw);

    const int G = Hq / Hkv;
    const int hk = blockIdx.y;
    const int R = T * G;
    const int r0 = (gridDim.x - 1 - blockIdx.x) * ATT_ROWS;  // last rows first
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long ldkv = (long)Hkv * D;

    // Q tile -> smem (through sK) -> registers
    {
        constexpr int CH = D / 8;
        for (int c = threadIdx.x; c < ATT_ROWS * CH; c += ATT_WARPS * 32) {
            const int i = c / CH, j = c - i * CH;
            const int r = r0 + i;
            const bool ok = r < R;
            const int t = ok ? r / G : 0, g = ok ? r - (r / G) * G : 0;
            const __half* src = q + (long)t * ldq + (long)(hk * G + g) * D + j * 8;
            cp_async16(sK + i * LDS + j * 8, src, ok);
        }
        cp_commit();
        cp_wait<0>();
        __syncthreads();
    }
    uint32_t qf[KSTEPS][4];
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk++)
        ldsm_x4(qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3],
                sK + (warp * 16 + (lane & 15)) * LDS + kk * 16 + (lane >> 4) * 8);
    __syncthreads();

    // the two rows this thread owns in the C fragments: their first and last visible keys
    const int ra = min(r0 + warp * 16 + (lane >> 2), R - 1);
    const int rb = min(r0 + warp * 16 + (lane >> 2) + 8, R - 1);
    const int2 ta = tok_at(tok, pos0, ra / G, window), tb = tok_at(tok, pos0, rb / G, window);
    const int lim_a = ta.x, lim_b = tb.x, lo_a = ta.y, lo_b = tb.y;
    const bool warp_active = r0 + warp * 16 < R;
    const int2 tfirst = tok_at(tok, pos0, r0 / G, window);
    const int2 tlast = tok_at(tok, pos0, (min(r0 + ATT_ROWS, R) - 1) / G, window);
    const int n_keys = tlast.x + 1;                  // keys the block may see (slots monotone)
    const int key_min_lim = tfirst.x;                // smallest row limit in the block
    const int key_max_lo = tlast.y;                  // largest first key in the block
    const int kt0 = tfirst.y / ATT_KEYS;             // the first tile any row sees
    const int n_tiles = (n_keys + ATT_KEYS - 1) / ATT_KEYS;

    float oacc[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;

    // prologue: tile kt0 -> stage 0 (one commit group per tile: K and V together)
    {
        const long kv0 = (long)kt0 * ATT_KEYS * ldkv + (long)hk * D;
        const int nv0 = min(ATT_KEYS, n_keys - kt0 * ATT_KEYS);
        load_kv_tile<D>(sK, kc + kv0, ldkv, nv0);
        load_kv_tile<D>(sK + TILE, vc + kv0, ldkv, nv0);
    }
    cp_commit();
    for (int kt = kt0; kt < n_tiles; kt++) {
        const int k0 = kt * ATT_KEYS;
        const __half* sKt = sK + ((kt - kt0) & 1) * 2 * TILE;
        const __half* sV = sKt + TILE;
        if (kt + 1 < n_tiles) {  // the other stage was last read in iteration kt - 1 (synced)
            const int k1 = k0 + ATT_KEYS, nv1 = min(ATT_KEYS, n_keys - k1);
            __half* dst = sK + ((kt - kt0 + 1) & 1) * 2 * TILE;
            load_kv_tile<D>(dst, kc + (long)k1 * ldkv + (long)hk * D, ldkv, nv1);
            load_kv_tile<D>(dst + TILE, vc + (long)k1 * ldkv + (long)hk * D, ldkv, nv1);
        }
        cp_commit();   // possibly empty group: keeps "all but the newest" = tile kt
        cp_wait<1>();
        __syncthreads();

        float s[ATT_KEYS / 8][4];
        if (warp_active) {
#pragma unroll
            for (int j = 0; j < ATT_KEYS / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < KSTEPS; kk++) {
#pragma unroll
                for (int j = 0; j < ATT_KEYS / 8; j += 2) {
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4(b0, b1, b2, b3,
                            sKt + (j * 8 + (lane >> 4) * 8 + (lane & 7)) * LDS + kk * 16 +
                                ((lane >> 3) & 1) * 8);
                    mma16816(s[j], qf[kk], b0, b1);
                    mma16816(s[j + 1], qf[kk], b2, b3);
                }
            }
            if (cap_s > 0.f) {   // (a model's option: uniform over the launch)
#pragma unroll
                for (int j = 0; j < ATT_KEYS / 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[j][e] = softcap(s[j][e], cap_s);
            }
            // causal mask on the tiles that reach past the smallest row limit, the sequence
            // (and window) mask on those before the largest first key
            if (k0 + ATT_KEYS - 1 > key_min_lim || k0 < key_max_lo) {
#pragma unroll
                for (int j = 0; j < ATT_KEYS / 8; j++) {
                    const int key = k0 + j * 8 + (lane & 3) * 2;
                    if (key > lim_a || key < lo_a) s[j][0] = -INFINITY;
                    if (key + 1 > lim_a || key + 1 < lo_a) s[j][1] = -INFINITY;
                    if (key > lim_b || key < lo_b) s[j][2] = -INFINITY;
                    if (key + 1 > lim_b || key + 1 < lo_b) s[j][3] = -INFINITY;
                }
            }
            // online softmax (rows a and b; the 4 threads of a quad share a row)
            float mxa = -INFINITY, mxb = -INFINITY;
#pragma unroll
            for (int j = 0; j < ATT_KEYS / 8; j++) {
                mxa = fmaxf(mxa, fmaxf(s[j][0], s[j][1]));
                mxb = fmaxf(mxb, fmaxf(s[j][2], s[j][3]));
            }
#pragma unroll
            for (int off = 1; off <= 2; off <<= 1) {
                mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, off));
                mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, off));
            }
            // a row whose keys all lie in later tiles (a packed sequence starting after the
            // block's first) keeps max -inf: its reference max is 0 then, so exp2 gives 0, not NaN
            const float mna = fmaxf(m_a, mxa), mnb = fmaxf(m_b, mxb);
            const float ua = mna == -INFINITY ? 0.f : mna, ub = mnb == -INFINITY ? 0.f : mnb;
            const float ca = exp2f((m_a - ua) * scale_log2), cb = exp2f((m_b - ub) * scale_log2);
            m_a = mna; m_b = mnb;
            const float ma_s = ua * scale_log2, mb_s = ub * scale_log2;
            float sa = 0.f, sb = 0.f;
#pragma unroll
            for (int j = 0; j < ATT_KEYS / 8; j++) {
                s[j][0] = exp2f(fmaf(s[j][0], scale_log2, -ma_s));
                s[j][1] = exp2f(fmaf(s[j][1], scale_log2, -ma_s));
                s[j][2] = exp2f(fmaf(s[j][2], scale_log2, -mb_s));
                s[j][3] = exp2f(fmaf(s[j][3], scale_log2, -mb_s));
                sa += s[j][0] + s[j][1];
                sb += s[j][2] + s[j][3];
            }
            l_a = l_a * ca + sa;
            l_b = l_b * cb + sb;
#pragma unroll
            for (int i = 0; i < DT; i++) {
                oacc[i][0] *= ca; oacc[i][1] *= ca;
                oacc[i][2] *= cb; oacc[i][3] *= cb;
            }
        }
        if (warp_active) {
#pragma unroll
            for (int ks = 0; ks < ATT_KEYS / 16; ks++) {
                uint32_t pa[4];
                pa[0] = pack_h2(s[2 * ks][0], s[2 * ks][1]);
                pa[1] = pack_h2(s[2 * ks][2], s[2 * ks][3]);
                pa[2] = pack_h2(s[2 * ks + 1][0], s[2 * ks + 1][1]);
                pa[3] = pack_h2(s[2 * ks + 1][2], s[2 * ks + 1][3]);
#pragma unroll
                for (int dn = 0; dn < DT; dn += 2) {
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4_t(b0, b1, b2, b3,
                              sV + (ks * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LDS +
                                  (dn + (lane >> 4)) * 8);
                    mma16816(oacc[dn], pa, b0, b1);
                    mma16816(oacc[dn + 1], pa, b2, b3);
                }
            }
        }
        __syncthreads();
    }

    if (!warp_active) return;
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
        l_a += __shfl_xor_sync(0xffffffffu, l_a, off);
        l_b += __shfl_xor_sync(0xffffffffu, l_b, off);
    }
    const float ia = 1.f / l_a, ib = 1.f / l_b;
    const int rra = r0 + warp * 16 + (lane >> 2), rrb = rra + 8;
    if (rra < R) {
        const int t = rra / G, g = rra - t * G;
        __half* dst = o + (long)t * ldo + (long)(hk * G + g) * D + (lane & 3) * 2;
#pragma unroll
        for (int i = 0; i < DT; i++)
            *reinterpret_cast<__half2*>(dst + i * 8) =
                __floats2half2_rn(oacc[i][0] * ia, oacc[i][1] * ia);
    }
    if (rrb < R) {
        const int t = rrb / G, g = rrb - t * G;
        __half* dst = o + (long)t * ldo + (long)(hk * G + g) * D + (lane & 3) * 2;
#pragma unroll
        for (int i = 0; i < DT; i++)
            *reinterpret_cast<__half2*>(dst + i * 8) =
                __floats2half2_rn(oacc[i][2] * ib, oacc[i][3] * ib);
    }
}

#define ATT_ENTRY(DD)                                                                           \
    extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)                                \
        attn_fwd_d##DD(const __half* q, long ldq, const __half* kc, const __half* vc, __half* o, \
                       long ldo, int T, int Hq, int Hkv, int pos0, const int2* tok,              \
                       float scale_log2, int window, float cap_s) {                             \
        attn_fwd<DD>(q, ldq, kc, vc, o, ldo, T, Hq, Hkv, pos0, tok, scale_log2, window, cap_s); \
    }
ATT_ENTRY(64)
ATT_ENTRY(96)
ATT_ENTRY(128)
#if ATT_KEYS <= 64 && ATT_WARPS <= 4   // 256 in the 4 x 64 build only: 8 x 128 would spill
ATT_ENTRY(256)
#endif
