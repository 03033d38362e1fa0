// dequant.cu: GGUF tensor data -> f16 (dq_f16_<type>) and quantized embedding gather -> f32
// (embed_<type>), bit-identical to gguf.quants.dequantize (then .astype(float16) for dq_f16).
//
// Types: f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_K q3_K q4_K q5_K q6_K iq4_nl iq4_xs.
// Entries (one pair per type, e.g. for q4_K):
//   dq_f16_q4_K(const uint8_t* src, i64 src_bytes, half* out, i64 n_elems)
//       src: raw rows [N, row_bytes] (contiguous = one flat run of blocks), out: f16 [N*K]
//   embed_q4_K(const uint8_t* table, i64 table_bytes, i64 row_bytes, i64 n_table_rows,
//              const int* ids, int T, float* out, i64 K)
//       table: raw rows [V, row_bytes], ids: [T], out: f32 [T, K]; an id outside [0, V)
//       yields a row of NaN (never a read out of bounds).
// Structure: both entries run one template, dq_run<Type, OutT>. Work is cut into items of
// EPC output elements (a contiguous byte range of the source); a CTA (256 threads) walks
// items grid-stride, staging the next item's bytes into shared memory with 16-byte cp.async
// while it dequantizes the current one (double buffer). Each thread then produces 8
// consecutive outputs per step (one 16 B store of f16, two of f32): stores are coalesced.
// Per type, `Type::dq8(block, j, v)` decodes outputs 8j..8j+7 of one block: the only
// per-type code, shared by both entries.
//
// Numerics: in every type each product is exact in f32 (an f16 scale has an 11-bit
// significand, times an integer sub-scale times an integer quant fits in 24 bits), so the
// only f32 roundings are the final add/sub and the f16 cast, as in gguf's numpy code. All
// arithmetic still goes through __fmul_rn/__fadd_rn/__fsub_rn, which nvcc never contracts into
// FMA, in gguf's association ((d*sc)*q - dmin*m): that also pins the signs of zeros.
// Launcher: minfer/cuda/ops/dequant.py. Block layouts: quant_blocks.cuh.
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include "quant_blocks.cuh"

#define DQ_THREADS 256

// ---- small exact helpers (host+device: tests/dequant_host.cu runs the decoders on the CPU) --
#define HD __host__ __device__ __forceinline__
HD uint32_t ld_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
// 4 bytes from a 2-byte aligned address (every block size and field offset is even).
HD uint32_t ld_u32_a2(const uint8_t* p) { return ld_u16(p) | (ld_u16(p + 2) << 16); }
HD float ld_f16(const uint8_t* p) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(ld_u16(p))));
}
HD float bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}
// Rounded f32 ops that are never contracted into an FMA (host build: -ffp-contract=off).
HD float dq_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
HD float dq_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
HD float dq_sub(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}
// float(q) for |q| < 2^22, exactly: 1.5*2^23 has ulp 1, so adding q to its bits adds q.
HD float i2f(int q) { return dq_sub(bits_f32(0x4B400000u + q), 12582912.0f); }
// byte k (0..7) of the 8 bytes (lo, hi)
HD uint32_t byte8(uint32_t lo, uint32_t hi, int k) { return ((k < 4 ? lo : hi) >> (8 * (k & 3))) & 0xFFu; }
// kvalues_iq4nl = {-127,-104,-83,-65,-49,-35,-22,-10,1,13,25,38,53,69,89,113} as int8 bytes,
// selected with byte_perm on the GPU (no divergent constant-memory loads).
HD int kvalue_iq4nl(uint32_t n) {
    const uint32_t w[4] = {0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u};
#ifdef __CUDA_ARCH__
    const uint32_t r = (n & 8) ? __byte_perm(w[2], w[3], n & 7) : __byte_perm(w[0], w[1], n & 7);
#else
    const uint32_t r = w[n >> 2] >> (8 * (n & 3));
#endif
    return static_cast<int>(static_cast<int8_t>(r & 0xFF));
}

#define OFF(T, f) ((int)offsetof(T, f))

// ---- per-type decoders: v[0..7] = weights 8j..8j+7 of the block at b --------------------------
struct T_F32 {
    static constexpr int QK = 1, TS = 4;
    HD static void dq8(const uint8_t* b, int, float* v) {
        const float* f = reinterpret_cast<const float*>(b);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = f[k];
    }
};
struct T_F16 {
    static constexpr int QK = 1, TS = 2;
    HD static void dq8(const uint8_t* b, int, float* v) {
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = ld_f16(b + 2 * k);
    }
};
struct T_BF16 {  // gguf: (int16 << 16) viewed as f32
    static constexpr int QK = 1, TS = 2;
    HD static void dq8(const uint8_t* b, int, float* v) {
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = bits_f32(ld_u16(b + 2 * k) << 16);
    }
};

// 32-weight blocks: weight i < 16 is the low nibble of qs[i], weight i >= 16 the high one of
// qs[i-16]; group j covers weights 8j..8j+7 -> bytes qs[8*(j&1) ..], shift 4*(j>>1).
struct T_Q4_0 {
    static constexpr int QK = 32, TS = sizeof(block_q4_0);
    HD static void dq8(const uint8_t* b, int j, float* v) {
        const float d = ld_f16(b + OFF(block_q4_0, d));
        const uint8_t* q = b + OFF(block_q4_0, qs) + 8 * (j & 1);
        const uint32_t lo = ld_u32_a2(q), hi = ld_u32_a2(q + 4), sh = 4 * (j >> 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = dq_mul(d, i2f(int((byte8(lo, hi, k) >> sh) & 15) - 8));
    }
};
struct T_Q4_1 {  // (d * q) + m
    static constexpr int QK = 32, TS = sizeof(block_q4_1);
    HD static void dq8(const uint8_t* b, int j, float* v) {
        const float d = ld_f16(b + OFF(block_q4_1, d)), m = ld_f16(b + OFF(block_q4_1, m));
        const uint8_t* q = b + OFF(block_q4_1, qs) + 8 * (j & 1);
        const uint32_t lo = ld_u32_a2(q), hi = ld_u32_a2(q + 4), sh = 4 * (j >> 1);
#pragma unroll
        for (int k = 0; k < 8; ++k)
            v[k] = dq_add(dq_mul(d, i2f(int((byte8(lo, hi, k) >> sh) & 15))), m);
    }
};
struct T_Q5_0 {  // 5th bit of weight i is bit i of qh
    static constexpr int QK = 32, TS = sizeof(block_q5_0);
    HD static void dq8(const uint8_t* b, int j, float* v) {
        const float d = ld_f16(b + OFF(block_q5_0, d));
        const uint32_t qh = ld_u32_a2(b + OFF(block_q5_0, qh)) >> (8 * j);
        const uint8_t* q = b + OFF(block_q5_0, qs) + 8 * (j & 1);
        const uint32_t lo = ld_u32_a2(q), hi = ld_u32_a2(q + 4), sh = 4 * (j >> 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int n = int(((byte8(lo, hi, k) >> sh) & 15) | (((qh >> k) & 1) << 4));
            v[k] = dq_mul(d, i2f(n - 16));
        }
    }
};
struct T_Q5_1 {
    static constexpr int QK = 32, TS = sizeof(block_q5_1);
    HD static void dq8(const uint8_t* b, int j, float* v) {
        const float d = ld_f16(b + OFF(block_q5_1, d)), m = ld_f16(b + OFF(block_q5_1, m));
        const uint32_t qh = ld_u32_a2(b + OFF(block_q5_1, qh)) >> (8 * j);
        const uint8_t* q = b + OFF(block_q5_1, qs) + 8 * (j & 1);
        const uint32_t lo = ld_u32_a2(q), hi = ld_u32_a2(q + 4), sh = 4 * (j >> 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int n = int(((byte8(lo, hi, k) >> sh) & 15) | (((qh >> k) & 1) << 4));
            v[k] = dq_add(dq_mul(d, i2f(n)), m);
        }
    }
};
struct T_Q8_0 {  // x * d
    static constexpr int QK = 32, TS = sizeof(block_q8_0);
    HD static void dq8(const uint8_t* b, int j, float* v) {
        const float d = ld_f16(b + OFF(block_q8_0, d));
        const uint8_t* q = b + OFF(block_q8_0, qs) + 8 * j;
        const uint32_t lo = ld_u32_a2(q), hi = ld_u32_a2(q + 4);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = dq_mul(i2f(int(int8_t(byte8(lo, hi, k)))), d);
    }
};
struct T_IQ4_NL {  // d * kvalues[nibble], nibble order as q4_0
    static constexpr int QK = 32, TS = sizeof(block_iq4_nl);
    HD static void dq8(const uint8_t* b, int j, float* v) {
        const float d = ld_f16(b + OFF(block_iq4_nl, d));
        const uint8_t* q = b + OFF(block_iq4_nl, qs) + 8 * (j & 1);
        const uint32_t lo = ld_u32_a2(q), hi = ld_u32_a2(q + 4), sh = 4 * (j >> 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = dq_mul(d, i2f(kvalue_iq4nl((byte8(lo, hi, k) >> sh) & 15)));
    }
};

// 256-weight super-blocks. Weight e of a q2_K/q3_K block: byte qs[32*(e>>7) + (e&31)], bits
// 2*((e>>5)&3); sub-block (16 weights) e>>4.
struct T_Q2_K {  // dl*q - ml, dl = d*(sc&15), ml = dmin*(sc>>4)
    static constexpr int QK = 256, TS = sizeof(block_q2_K);
    HD static void dq8(const uint8_t* b, int j, float* v) {
        const int e0 = 8 * j;
        const uint32_t sc = b[OFF(block_q2_K, scales) + (e0 >> 4)];
        const float dl = dq_mul(ld_f16(b + OFF(block_q2_K, d)), i2f(int(sc & 15)));
        const float ml = dq_mul(ld_f16(b + OFF(block_q2_K, dmin)), i2f(int(sc >> 4)));
        const uint8_t* q = b + OFF(block_q2_K, qs) + 32 * (e0 >> 7) + (e0 & 31);
        const uint32_t lo = ld_u32_a2(q), hi = ld_u32_a2(q + 4), sh = 2 * ((e0 >> 5) & 3);
#pragma unroll
        for (int k = 0; k < 8; ++k)
            v[k] = dq_sub(dq_mul(dl, i2f(int((byte8(lo, hi, k) >> sh) & 3))), ml);
    }
};
struct T_Q3_K {  // (d*(sc-32)) * (q2 - (hbit ? 0 : 4)); hbit of weight e: hmask[e&31] bit e>>5
    static constexpr int QK = 256, TS = sizeof(block_q3_K);
    HD static void dq8(const uint8_t* b, int j, float* v) {
        const int e0 = 8 * j, sb = e0 >> 4;
        const uint8_t* s = b + OFF(block_q3_K, scales);
        const uint32_t ls = (s[sb & 7] >> (4 * (sb >> 3))) & 15;
        const uint32_t hs = (s[8 + (sb & 3)] >> (2 * (sb >> 2))) & 3;
        const float dl = dq_mul(ld_f16(b + OFF(block_q3_K, d)), i2f(int(ls | (hs << 4)) - 32));
        const uint8_t* q = b + OFF(block_q3_K, qs) + 32 * (e0 >> 7) + (e0 & 31);
        const uint8_t* h = b + OFF(block_q3_K, hmask) + (e0 & 31);
        const uint32_t lo = ld_u32_a2(q), hi = ld_u32_a2(q + 4), sh = 2 * ((e0 >> 5) & 3);
        const uint32_t hlo = ld_u32_a2(h), hhi = ld_u32_a2(h + 4), hb = e0 >> 5;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int q2 = int((byte8(lo, hi, k) >> sh) & 3);
            const int hbit = int((byte8(hlo, hhi, k) >> hb) & 1);
            v[k] = dq_mul(dl, i2f(q2 - ((hbit ^ 1) << 2)));
        }
    }
};
// get_scale_min_k4 of sub-block sb (0..7) from the 12 packed scale bytes s
HD void scale_min_k4(const uint8_t* s, int sb, int& sc, int& m) {
    if (sb < 4) {
        sc = s[sb] & 63;
        m = s[sb + 4] & 63;
    } else {
        sc = (s[sb + 4] & 15) | ((s[sb - 4] >> 6) << 4);
        m = (s[sb + 4] >> 4) | ((s[sb] >> 6) << 4);
    }
}
// Weight e of a q4_K/q5_K block: nibble (e>>5)&1 of qs[32*(e>>6) + (e&31)], sub-block e>>5.
struct T_Q4_K {  // (d*sc)*q - dmin*m
    static constexpr int QK = 256, TS = sizeof(block_q4_K);
    HD static void dq8(const uint8_t* b, int j, float* v) {
        const int e0 = 8 * j;
        int sc, m;
        scale_min_k4(b + OFF(block_q4_K, scales), e0 >> 5, sc, m);
        const float ds = dq_mul(ld_f16(b + OFF(block_q4_K, d)), i2f(sc));
        const float dm = dq_mul(ld_f16(b + OFF(block_q4_K, dmin)), i2f(m));
        const uint8_t* q = b + OFF(block_q4_K, qs) + 32 * (e0 >> 6) + (e0 & 31);
        const uint32_t lo = ld_u32_a2(q), hi = ld_u32_a2(q + 4), sh = 4 * ((e0 >> 5) & 1);
#pragma unroll
        for (int k = 0; k < 8; ++k)
            v[k] = dq_sub(dq_mul(ds, i2f(int((byte8(lo, hi, k) >> sh) & 15))), dm);
    }
};
struct T_Q5_K {  // as q4_K, 5th bit of weight e: qh[e&31] bit e>>5
    static constexpr int QK = 256, TS = sizeof(block_q5_K);
    HD static void dq8(const uint8_t* b, int j, float* v) {
        const int e0 = 8 * j;
        int sc, m;
        scale_min_k4(b + OFF(block_q5_K, scales), e0 >> 5, sc, m);
        const float ds = dq_mul(ld_f16(b + OFF(block_q5_K, d)), i2f(sc));
        const float dm = dq_mul(ld_f16(b + OFF(block_q5_K, dmin)), i2f(m));
        const uint8_t* q = b + OFF(block_q5_K, qs) + 32 * (e0 >> 6) + (e0 & 31);
        const uint8_t* h = b + OFF(block_q5_K, qh) + (e0 & 31);
        const uint32_t lo = ld_u32_a2(q), hi = ld_u32_a2(q + 4), sh = 4 * ((e0 >> 5) & 1);
        const uint32_t hlo = ld_u32_a2(h), hhi = ld_u32_a2(h + 4), hb = e0 >> 5;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int n = int(((byte8(lo, hi, k) >> sh) & 15) | (((byte8(hlo, hhi, k) >> hb) & 1) << 4));
            v[k] = dq_sub(dq_mul(ds, i2f(n)), dm);
        }
    }
};
// Weight e of a q6_K block: nibble (e>>6)&1 of ql[64*(e>>7) + (e&63)], high 2 bits at
// 2*((e>>5)&3) of qh[32*(e>>7) + (e&31)], scale scales[e>>4].
struct T_Q6_K {  // (d*sc) * (q - 32)
    static constexpr int QK = 256, TS = sizeof(block_q6_K);
    HD static void dq8(const uint8_t* b, int j, float* v) {
        const int e0 = 8 * j;
        const int sc = int(int8_t(b[OFF(block_q6_K, scales) + (e0 >> 4)]));
        const float ds = dq_mul(ld_f16(b + OFF(block_q6_K, d)), i2f(sc));
        const uint8_t* ql = b + OFF(block_q6_K, ql) + 64 * (e0 >> 7) + (e0 & 63);
        const uint8_t* qh = b + OFF(block_q6_K, qh) + 32 * (e0 >> 7) + (e0 & 31);
        const uint32_t lo = ld_u32_a2(ql), hi = ld_u32_a2(ql + 4), sh = 4 * ((e0 >> 6) & 1);
        const uint32_t hlo = ld_u32_a2(qh), hhi = ld_u32_a2(qh + 4), hsh = 2 * ((e0 >> 5) & 3);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int n = int(((byte8(lo, hi, k) >> sh) & 15) | (((byte8(hlo, hhi, k) >> hsh) & 3) << 4));
            v[k] = dq_mul(ds, i2f(n - 32));
        }
    }
};
// Weight e of an iq4_xs block: sub-block ib = e>>5, nibble ((e>>4)&1) of qs[16*ib + (e&15)].
struct T_IQ4_XS {  // (d*(sc-32)) * kvalues[nibble]
    static constexpr int QK = 256, TS = sizeof(block_iq4_xs);
    HD static void dq8(const uint8_t* b, int j, float* v) {
        const int e0 = 8 * j, ib = e0 >> 5;
        const uint32_t ls = (b[OFF(block_iq4_xs, scales_l) + (ib >> 1)] >> (4 * (ib & 1))) & 15;
        const uint32_t hs = (ld_u16(b + OFF(block_iq4_xs, scales_h)) >> (2 * ib)) & 3;
        const float dl = dq_mul(ld_f16(b + OFF(block_iq4_xs, d)), i2f(int(ls | (hs << 4)) - 32));
        const uint8_t* q = b + OFF(block_iq4_xs, qs) + 16 * ib + (e0 & 15);
        const uint32_t lo = ld_u32_a2(q), hi = ld_u32_a2(q + 4), sh = 4 * ((e0 >> 4) & 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = dq_mul(dl, i2f(kvalue_iq4nl((byte8(lo, hi, k) >> sh) & 15)));
    }
};

#ifndef MINFER_DQ_DECODERS_ONLY  // (tests/native/dequant_host.cu takes the decoders alone)
// ---- stores: 8 outputs, vectorized when whole and 16-byte aligned ---------------------------
__device__ __forceinline__ uint32_t pack_h2(float a, float b) {
    union { __half2 h; uint32_t u; } c;
    c.h = __floats2half2_rn(a, b);  // a -> low half (lower address)
    return c.u;
}
__device__ __forceinline__ void store8(__half* o, const float* v, int n) {
    if (n == 8 && (reinterpret_cast<uintptr_t>(o) & 15) == 0) {
        *reinterpret_cast<uint4*>(o) =
            make_uint4(pack_h2(v[0], v[1]), pack_h2(v[2], v[3]), pack_h2(v[4], v[5]), pack_h2(v[6], v[7]));
    } else {
        for (int k = 0; k < n; ++k) o[k] = __float2half_rn(v[k]);
    }
}
__device__ __forceinline__ void store8(float* o, const float* v, int n) {
    if (n == 8 && (reinterpret_cast<uintptr_t>(o) & 15) == 0) {
        reinterpret_cast<float4*>(o)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4*>(o)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
        for (int k = 0; k < n; ++k) o[k] = v[k];
    }
}

// ---- staging: bytes [a, a+nb) of src into sm, from a & ~15 on, in 16 B chunks ---------------
// A chunk wholly inside the source goes by cp.async (16 B, L2 only); one crossing its end is
// copied byte by byte, so nothing past src_bytes is ever read.
__device__ __forceinline__ void stage(uint8_t* sm, const uint8_t* src, long long src_bytes,
                                      long long a, long long nb) {
    const long long a16 = a & ~15LL;
    const int nchunks = int((a + nb - a16 + 15) >> 4);
    for (int c = threadIdx.x; c < nchunks; c += blockDim.x) {
        const long long off = a16 + 16LL * c;
        if (off + 16 <= src_bytes) {
            const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(sm + 16 * c));
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src + off));
        } else {
            for (int k = 0; k < 16 && off + k < src_bytes; ++k) sm[16 * c + k] = src[off + k];
        }
    }
}
__device__ __forceinline__ void commit_group() { asm volatile("cp.async.commit_group;\n" ::); }

// One work item: EPC outputs (fewer at a row's end) of output row r, from source row `row`.
struct Item {
    long long a, nb;    // source byte range
    long long out;      // first output element
    int n;              // outputs in this item
    bool valid;         // source row in range
};

template <class T, int EPC>
__device__ __forceinline__ Item item_of(long long w, long long items_per_row, long long row_elems,
                                        long long row_bytes, long long n_src_rows, const int* ids) {
    Item it;
    const long long r = w / items_per_row, c = w - r * items_per_row;
    const long long row = ids ? static_cast<long long>(ids[r]) : r;
    const long long e_lo = c * EPC;
    it.n = static_cast<int>(min(static_cast<long long>(EPC), row_elems - e_lo));
    it.valid = row >= 0 && row < n_src_rows;
    it.a = row * row_bytes + e_lo / T::QK * T::TS;
    it.nb = static_cast<long long>(it.n) / T::QK * T::TS;  // n is a multiple of QK
    it.out = r * row_elems + e_lo;
    return it;
}

// The shared body. Rows: n_rows output rows of row_elems each; output row r reads source row
// ids[r] (ids == nullptr: row r). dq_f16 runs it as one flat row of N*K.
template <class T, class OutT>
__device__ __forceinline__ void dq_run(const uint8_t* __restrict__ src, long long src_bytes,
                                       long long row_bytes, long long n_src_rows,
                                       const int* __restrict__ ids, long long n_rows,
                                       OutT* __restrict__ out, long long row_elems) {
    constexpr int EPC = T::QK == 1 ? 4096 : 8192;  // outputs per item
    static_assert(EPC % T::QK == 0 && EPC % (8 * DQ_THREADS) == 0, "EPC");
    constexpr int BUF = (EPC / T::QK * T::TS + 16 + 15) / 16 * 16;  // + misalignment slack
    __shared__ __align__(16) uint8_t sm[2][BUF];

    const long long items_per_row = (row_elems + EPC - 1) / EPC;
    const long long n_items = n_rows * items_per_row;
    long long w = blockIdx.x;
    if (w >= n_items) return;
    Item cur = item_of<T, EPC>(w, items_per_row, row_elems, row_bytes, n_src_rows, ids);
    if (cur.valid) stage(sm[0], src, src_bytes, cur.a, cur.nb);
    commit_group();  // exactly one group per staged item (empty when nothing was staged)
    for (int buf = 0; w < n_items; w += gridDim.x, buf ^= 1) {
        // prefetch the next item into the other buffer while this one is decoded
        const long long wn = w + gridDim.x;
        Item nxt{};
        if (wn < n_items) {
            nxt = item_of<T, EPC>(wn, items_per_row, row_elems, row_bytes, n_src_rows, ids);
            if (nxt.valid) stage(sm[buf ^ 1], src, src_bytes, nxt.a, nxt.nb);
        }
        commit_group();
        asm volatile("cp.async.wait_group 1;\n" ::);  // all but the prefetch: cur has landed
        __syncthreads();
        const uint8_t* data = sm[buf] + (cur.a & 15);
        for (int g = threadIdx.x; 8 * g < cur.n; g += blockDim.x) {
            const int e0 = 8 * g;
            float v[8];
            if (cur.valid) {
                T::dq8(data + (e0 / T::QK) * T::TS, (e0 % T::QK) / 8, v);
            } else {
#pragma unroll
                for (int k = 0; k < 8; ++k) v[k] = bits_f32(0x7FC00000u);  // NaN row
            }
            store8(out + cur.out + e0, v, min(8, cur.n - e0));
        }
        __syncthreads();  // sm[buf] is restaged by the next iteration's prefetch
        cur = nxt;
    }
}

#define DQ_ENTRIES(name, T)                                                                      \
    extern "C" __global__ void __launch_bounds__(DQ_THREADS)                                     \
        dq_f16_##name(const uint8_t* src, long long src_bytes, __half* out, long long n_elems) { \
        dq_run<T, __half>(src, src_bytes, 0, 1, nullptr, 1, out, n_elems);                        \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(DQ_THREADS)                                     \
        embed_##name(const uint8_t* table, long long table_bytes, long long row_bytes,           \
                     long long n_table_rows, const int* ids, int T_, float* out, long long K) {  \
        dq_run<T, float>(table, table_bytes, row_bytes, n_table_rows, ids, T_, out, K);          \
    }

DQ_ENTRIES(f32, T_F32)
DQ_ENTRIES(f16, T_F16)
DQ_ENTRIES(bf16, T_BF16)
DQ_ENTRIES(q4_0, T_Q4_0)
DQ_ENTRIES(q4_1, T_Q4_1)
DQ_ENTRIES(q5_0, T_Q5_0)
DQ_ENTRIES(q5_1, T_Q5_1)
DQ_ENTRIES(q8_0, T_Q8_0)
DQ_ENTRIES(q2_K, T_Q2_K)
DQ_ENTRIES(q3_K, T_Q3_K)
DQ_ENTRIES(q4_K, T_Q4_K)
DQ_ENTRIES(q5_K, T_Q5_K)
DQ_ENTRIES(q6_K, T_Q6_K)
DQ_ENTRIES(iq4_nl, T_IQ4_NL)
DQ_ENTRIES(iq4_xs, T_IQ4_XS)
#endif  // MINFER_DQ_DECODERS_ONLY
