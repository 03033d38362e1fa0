// attention_sm90a.cu: causal GQA flash attention for prefill on Hopper tensor cores (wgmma,
// sm_90a only), the contract of attention.cu's attn_fwd_d64 / attn_fwd_d128:
//   o[t, h, :] = softmax_j( cap(q[t, h, :] . k[j, h/G, :] * scale) ) v[j, h/G, :],
//   lo_t <= j <= slot_t and slot_t - j < window (window > 0; cap: tanh soft-cap, cap_s > 0)
//   (tok: int2 [T] (slot, lo) per query token, as attention.cu; null: slot pos0 + t, lo 0)
//   q: f16 [T, Hq, D] (token stride ldq), k/v cache: f16 [S, Hkv, D], o: f16 [T, Hq, D] (ldo).
// minfer-archs: sm_90a   (tests/test_kernel_compile.py builds this file for sm_90a only)
// Numpy twin: minfer.reference.ops.attention; launcher: minfer/cuda/ops/attention.py (pick_impl takes
// this kernel for prefill on sm_90, attention.cu elsewhere and for decode).
//
// Entries: attn_wg_d64, attn_wg_d128 (attn_fwd_d*'s arguments: + window, cap_s, as
// attention_common.cuh); attn_wg_d128_blk (+ ob, Tp): o and/or the block path's token operand
// of it from the epilogue (blk_operand.cuh); attn_wg_tma_d64 / _d128: the same with the K/V
// tiles loaded by TMA (the caches as tensor maps; + ob, Tp at D = 128).
// Work: an item = one KV head x 128 rows, a row being a (token, query head of the group) pair
// r = t G + g as in attention.cu (the G heads sharing a KV head share each K/V tile). Items go
// longest first, the heads interleaved (causal: the last rows see the most keys), to a grid
// of any size (item_at): one block per item, or persistent, a block per SM walking items,
// where the next item's Q rows and K/V tiles load under the current one's tail (the
// launcher's wg_blocks chooses).
// Structure: 384 threads, warp-specialized (FlashAttention-3's layout): warpgroup 0 copies each
// item's Q rows (cp.async; each consumer's 64 once that consumer has read its last, qempty)
// and then the 128-key K/V tiles into a 3-stage ring: by TMA (one thread, the stage's `full`
// mbarrier counting the bytes) or cp.async (each thread's copies arriving on `full`,
// cp.async.mbarrier.arrive), a tile reaching past the item's last key always by cp.async (its
// rows past that key zero-filled); warpgroups 1, 2 own 64 rows each and per tile compute
// S = Q K^T with wgmma m64n128k16 (Q and K from shared memory, K-major: D contiguous), the
// online softmax on the S fragment (f32, ex2.approx; the causal mask only on the diagonal
// tiles), then O += P V with P from registers (the S accumulator rounded to
// f16 is the A fragment: rows g, g + 8 of each warp's 16, keys 2t, 2t + 1 and 2t + 8, 2t + 9 of
// each 16-key step) and V from shared memory MN-major (V's rows are keys with D contiguous: the
// transposed-B form), and release the stage on its `empty` mbarrier. Within a warpgroup, tile
// kt's S and tile kt - 1's P V are issued together and tile kt's softmax runs under that P V
// (FlashAttention-3's intra-warpgroup overlap); the consumers take turns issuing (named
// barriers), so one's softmax also runs under the other's wgmmas. Tiles in shared memory are
// 64-column panels of 128-byte rows in the 128-byte-swizzle pattern (16-byte chunk c of row r
// at r * 128 + ((c ^ r % 8) * 16): TMA's SWIZZLE_128B). The wgmma pipeline is drained within
// each iteration (no accumulator in flight across the loop edge, where ptxas would serialize
// the wgmmas).
// Dynamic smem AttnWgSmem<D>::BYTES (D = 128: 225 KB; 64: 113 KB).
// Timing builds (wrong results; scripts/attn_one.py --opts, device_run.sh attn): -DATT_WG_NOLOAD
// the producer copies the first STAGES K/V tiles only, so the consumers' time alone shows what
// the loads cost; -DATT_WG_NOEXP the softmax without its ex2 (what the MUFU work costs).
#include <cuda_fp16.h>
#include <stdint.h>

#include "attention_common.cuh"   // tok_at (window), softcap
#include "blk_operand.cuh"
#include "gemm_f16_common.cuh"
#include "wgmma_common.cuh"

namespace {
using gemm_f16::cp_async16;
using gemm_f16::smem_u32;

// 3 warpgroups: a producer (cp.async into the K/V ring) and 2 consumers of 64 rows
constexpr int ROWS = 128, KEYS = 128, THREADS = 384, STAGES = 3;
constexpr int CONSUMER_REGS = 224, PRODUCER_REGS = 56;
// setmaxnreg moves registers within the block's launch allocation (168 per thread at 384
// threads): a consumer increase beyond what the producer released would wait forever
static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= 384 * 168, "register budget");

template <int D>
struct AttnWgSmem {
    static constexpr int Q = 0;   // [ROWS x D] as D / 64 panels of 128-byte rows (as K and V)
    static constexpr int KV = ROWS * D * 2;             // stage s: K at KV + 2 s TILE, V + TILE
    static constexpr int TILE = KEYS * D * 2;
    // qfull[2], qempty[2] (one per consumer's 64 Q rows), full[STAGES], empty[STAGES]
    static constexpr int BARS = KV + STAGES * 2 * TILE;
    static constexpr int BYTES = BARS + 8 * (4 + 2 * STAGES) + 1024;   // + 1 KB alignment
};
static_assert(AttnWgSmem<128>::BYTES <= 227 * 1024 && AttnWgSmem<64>::BYTES <= 227 * 1024,
              "within the opt-in shared memory");
static_assert(AttnWgSmem<128>::BYTES == 230480 && AttnWgSmem<64>::BYTES == 115792,
              "minfer/cuda/ops/attention.py wg_smem_bytes (tests/test_attention_launcher_cpu.py)");
static_assert(ROWS * 128 % 1024 == 0 && KEYS * 128 % 1024 == 0, "panels keep 1 KB swizzle atoms");

// byte offset of 16-byte chunk cc (of D / 8) of row r in a [rows x D] panelled tile
__device__ __forceinline__ uint32_t chunk_at(int rows, int r, int cc) {
    return (cc >> 3) * rows * 128 + r * 128 + (((cc & 7) ^ (r & 7)) << 4);
}

// A K or V tile: KEYS rows of D halves (row i from src + i * ld; rows >= n_valid zero-filled)
// into the panelled layout, by the producer's 128 threads: thread p always moves chunk p % CH of
// rows p / CH + RSTEP i, so its smem offset steps by RSTEP rows (RSTEP % 8 == 0: the swizzle
// phase is the same) and its source by RSTEP rows (the address arithmetic once per thread)
template <int D>
__device__ __forceinline__ void load_kv(uint32_t dst, const __half* src, long ld, int n_valid,
                                        int p) {
    constexpr int CH = D / 8, RSTEP = 128 / CH;
    static_assert(RSTEP % 8 == 0 && KEYS % RSTEP == 0, "whole swizzle periods per pass");
    const int r = p / CH, cc = p % CH;
    uint32_t d = dst + chunk_at(KEYS, r, cc);
    const __half* sp = src + (long)r * ld + cc * 8;
    const long step = RSTEP * ld;
#pragma unroll 4
    for (int row = r; row < KEYS; row += RSTEP, d += RSTEP * 128, sp += step) {
        const bool ok = row < n_valid;
        cp_async16(d, ok ? sp : src, ok);
    }
}

// MN-major operand (V: keys x D, D contiguous): 64 D-columns per 128-byte row, the next 64 a
// panel (LBO) further; 8 key rows per 1 KB atom, the next 8 keys SBO = 1 KB further
__device__ __forceinline__ uint64_t desc_mn(uint32_t saddr) {
    uint64_t d = static_cast<uint64_t>((saddr & 0x3FFFF) >> 4);
    d |= static_cast<uint64_t>((KEYS * 128) >> 4) << 16;   // LBO: the next 64 columns
    d |= static_cast<uint64_t>(1024 >> 4) << 32;           // SBO: the next 8 keys
    d |= static_cast<uint64_t>(1) << 62;                   // 128-byte swizzle
    return d;
}

// the "+f" operands of f32 accumulator registers 0..31 (AW_FA) and 32..63 (AW_FB), and the
// register lists of an m64n64 (AW_L32) and an m64n128 (AW_L64) accumulator
#define AW_FA(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), \
    "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),   \
    "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), \
    "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), \
    "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define AW_FB(d) "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),         \
    "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
    "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), \
    "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), \
    "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define AW_L32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define AW_L64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "        \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "        \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// s (64 rows x 128 keys, f32) = (acc ? s : 0) + Q (smem) K^T (smem), one k16 step
__device__ __forceinline__ void wg_qk(float (&s)[64], uint64_t qd, uint64_t kd, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " AW_L64
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : AW_FA(s), AW_FB(s)
                 : "l"(qd), "l"(kd), "r"(acc));
}

// o (64 rows x D, f32) += P (registers: 64 rows x 16 keys) V (smem, MN-major), one k16 step
__device__ __forceinline__ void wg_pv(float (&o)[64], const uint32_t (&a)[4], uint64_t vd) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " AW_L64
                 ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
                 : AW_FA(o), AW_FB(o)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(vd));
}
__device__ __forceinline__ void wg_pv(float (&o)[32], const uint32_t (&a)[4], uint64_t vd) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " AW_L32
                 ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
                 : AW_FA(o)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(vd));
}

__device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ float ex2(float x) {   // 2^x, MUFU.EX2 alone (P is f16 anyway)
#ifdef ATT_WG_NOEXP   // timing build: no MUFU (a value in [0, 1], as 2^x of x <= 0)
    return __saturatef(x + 1.f);
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#endif
}
__device__ __forceinline__ void bar_sync(int id) {
    asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id) {
    asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}

// the block path's token operand of o (attn_wg_d128_blk; D = 128: a head's row is one 128-K
// block) for the thread's row: its 32 values o[8 j + 2 t4 + b] (v[2 j + b]) rotated across the
// quad (lanes xor 1, 2: o's bits 1, 2), quantized, into image row t % 128 of block (head, t /
// 128); ob: [Hq, Tp / 128, OP] (blk_ref.blk_operand's layout). Every lane calls it (shuffles);
// `store` false (a row >= R) writes nothing.
__device__ __forceinline__ void row_operand(float (&v)[32], int t4, bool store, int t, int head,
                                            int Tp, uint8_t* __restrict__ ob) {
    using namespace blkop;
    butterfly<0>(v);          // h = 1
    butterfly_x(v, t4, 1);    // h = 2
    butterfly_x(v, t4, 2);    // h = 4
    butterfly<1>(v);          // h = 8 .. 64: j's bits
    butterfly<2>(v);
    butterfly<3>(v);
    butterfly<4>(v);
    const float amax = block_amax(v, 2);
    if (!store) return;
    uint8_t* blk = block_at(ob, head, Tp, t);
    const float inv = q8_inv(amax);
    const int r = t & 127;
#pragma unroll
    for (int j = 0; j < 16; ++j) {   // bytes 8 j + 2 t4, + 1 of the row
        const int c = 8 * j + 2 * t4;
        const uint32_t q = __byte_perm(q8(v[2 * j], inv), q8(v[2 * j + 1], inv), 0x0040);
        *reinterpret_cast<uint16_t*>(img_at(blk, r, c)) = static_cast<uint16_t>(q);
    }
    if (t4 == 0) store_scale(blk, r, amax);
}

// A work item: one KV head's 128 rows [r0, r0 + 128); the tiles kt0 .. kt0 + n_tiles - 1 of keys
// its rows may see (slots and first keys non-decreasing in t: the first row has the smallest
// limit and first key, the last row the largest)
struct Item {
    int hk, r0;
    int2 tfirst, tlast;   // (slot, first key) of its first and last row's token
    int kt0, n_tiles;
};

// The block's j-th item, false past its last. Items go longest first (the last rows of a causal
// prefill see the most keys; item i: row block nrb - 1 - i / Hkv of head i % Hkv) and are dealt
// to the grid in rounds, snaking (even rounds: block b takes the b-th of the round, odd rounds
// the (gridDim - 1 - b)-th), so the blocks' totals stay within about one item of each other.
// A grid of nrb * Hkv blocks is one item each; a persistent grid (<= the SMs) walks several.
__device__ __forceinline__ bool item_at(int j, const int2* __restrict__ tok, int pos0, int T,
                                        int G, int Hkv, int window, Item& it) {
    const int nb = gridDim.x, b = blockIdx.x, R = T * G, nrb = (R + ROWS - 1) / ROWS;
    const int i = j * nb + ((j & 1) ? nb - 1 - b : b);
    if (i >= nrb * Hkv) return false;
    it.hk = i % Hkv;   // (a head's row blocks in a row instead: 0.63-0.78x at 2,048-16,384)
    it.r0 = (nrb - 1 - i / Hkv) * ROWS;
    it.tfirst = tok_at(tok, pos0, it.r0 / G, window);
    it.tlast = tok_at(tok, pos0, (min(it.r0 + ROWS, R) - 1) / G, window);
    it.kt0 = it.tfirst.y / KEYS;
    it.n_tiles = (it.tlast.x + KEYS) / KEYS - it.kt0;   // through the tile of key tlast.x
    return true;
}

template <int D>
__device__ void attn_wg(const __half* __restrict__ q, long ldq, const __half* __restrict__ kc,
                        const __half* __restrict__ vc, __half* __restrict__ o, long ldo, int T,
                        int Hq, int Hkv, int pos0, const int2* __restrict__ tok,
                        float scale_log2, int window, float cap_s,
                        uint8_t* __restrict__ ob = nullptr, int Tp = 0,
                        const wgmma::TensorMap* mk = nullptr,
                        const wgmma::TensorMap* mv = nullptr) {
    using S = AttnWgSmem<D>;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;
    // mbarriers: qfull[w] at 8 w, qempty[w] at 8 (2 + w), full[s] at 8 (4 + s), empty[s] at
    // 8 (4 + STAGES + s)
    const uint32_t bars = base + S::BARS;
    auto qfull = [&](int w) { return bars + 8 * w; };
    auto qempty = [&](int w) { return bars + 8 * (2 + w); };
    auto full = [&](int ring) { return bars + 8 * (4 + ring % STAGES); };
    auto empty = [&](int ring) { return bars + 8 * (4 + STAGES + ring % STAGES); };
    auto stage = [&](int ring) { return base + S::KV + (ring % STAGES) * 2 * S::TILE; };

    const int G = Hq / Hkv, R = T * G;
    const long ldkv = (long)Hkv * D;
    if (threadIdx.x == 0) {
        for (int w = 0; w < 2; ++w) {
            wgmma::mbar_init(qfull(w), 128);    // the producer's threads
            wgmma::mbar_init(qempty(w), 128);   // a consumer's
        }
        for (int s = 0; s < STAGES; ++s) {
            wgmma::mbar_init(full(s), 128);
            wgmma::mbar_init(empty(s), 256);    // both consumers'
        }
    }
    __syncthreads();

    Item it;
    if (threadIdx.x < 128) {   // producer warpgroup: per item each consumer's Q rows, then the
        wgmma::setmaxnreg_dec<PRODUCER_REGS>();   // K/V tiles into the ring (`ring`: tiles so far)
        constexpr int CH = D / 8;
        int ring = 0;
        for (int j = 0; item_at(j, tok, pos0, T, G, Hkv, window, it); ++j) {
            const int n_keys = it.tlast.x + 1;
            for (int w = 0; w < 2; ++w) {   // rows 64 w .. 64 w + 63, once consumer w is done
                if (j > 0) wgmma::mbar_wait(qempty(w), (j - 1) & 1);   // with the last item's
                for (int c = threadIdx.x; c < 64 * CH; c += 128) {
                    const int i = 64 * w + c / CH, cc = c % CH, r = it.r0 + i;
                    const bool ok = r < R;
                    const int t = ok ? r / G : 0, gh = ok ? r - t * G : 0;
                    cp_async16(base + S::Q + chunk_at(ROWS, i, cc),
                               q + (long)t * ldq + (long)(it.hk * G + gh) * D + cc * 8, ok);
                }
                wgmma::cp_async_arrive(qfull(w));
            }
            for (int kt = 0; kt < it.n_tiles; ++kt, ++ring) {
                const int k0 = (it.kt0 + kt) * KEYS, nv = min(KEYS, n_keys - k0);
                wgmma::mbar_wait(empty(ring), ((ring / STAGES) & 1) ^ 1);   // free
#ifdef ATT_WG_NOLOAD   // timing build: each stage keeps the tile it got first
                if (ring >= STAGES) {
                    wgmma::mbar_arrive(full(ring));
                    continue;
                }
#endif
                if (mk != nullptr && nv == KEYS) {   // TMA: one thread, the tile's bytes
                    if (threadIdx.x == 0) {
                        wgmma::mbar_expect_tx(full(ring), 2 * S::TILE);
#pragma unroll
                        for (int p = 0; p < D / 64; ++p) {   // 64-column panels
                            const uint32_t pan = stage(ring) + p * KEYS * 128;
                            wgmma::tma_load_2d(pan, mk, it.hk * D + 64 * p, k0, full(ring));
                            wgmma::tma_load_2d(pan + S::TILE, mv, it.hk * D + 64 * p, k0,
                                               full(ring));
                        }
                    } else {
                        wgmma::mbar_arrive(full(ring));
                    }
                    continue;
                }
                // cp.async (a partial tile: its rows past the last key zero-filled)
                const long off = (long)k0 * ldkv + (long)it.hk * D;
                load_kv<D>(stage(ring), kc + off, ldkv, nv, threadIdx.x);
                load_kv<D>(stage(ring) + S::TILE, vc + off, ldkv, nv, threadIdx.x);
                wgmma::cp_async_arrive(full(ring));
            }
        }
        gemm_f16::cp_async_wait<0>();   // (a thread's copies complete before it exits)
        return;
    }
    wgmma::setmaxnreg_inc<CONSUMER_REGS>();
    const int cw = (threadIdx.x >> 7) - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const uint32_t qa = base + S::Q + cw * 64 * 128;   // this warpgroup's 64 Q rows

    float oacc[D / 2];
    float m_a, m_b, l_a, l_b;
    float s[64];          // S of the current tile, then its probabilities (f32)
    uint32_t pa[8][4];    // P of the previous tile: the A fragments of its P V
    float ca = 0.f, cb = 0.f;   // O's rescale for the current tile's new row maxima
    int lim_a, lim_b, lo_a, lo_b;   // the two rows' last and first keys (this item)

    // S = Q K^T of the tile at sk (D / 16 k-steps, 32 bytes apart within a panel; issue only)
    auto issue_qk = [&](uint32_t sk) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const uint32_t off = (kk & 3) * 32;   // (k-steps 4.. in the next panel)
            wg_qk(s, wgmma::sw128_desc(qa + (kk >> 2) * ROWS * 128 + off),
                  wgmma::sw128_desc(sk + (kk >> 2) * KEYS * 128 + off), kk);
        }
    };
    // O += P V of a tile whose V is at sv: 8 k-steps of 16 keys, 2 KB (16 key rows) apart
    auto issue_pv = [&](uint32_t sv) {
#pragma unroll
        for (int ks = 0; ks < 8; ++ks) wg_pv(oacc, pa[ks], desc_mn(sv + ks * 2048));
    };
    // the online softmax of tile k0's S (rows a = g, b = g + 8; a quad's 4 threads share a
    // row): the causal mask where the tile reaches past the item's smallest row limit and the
    // sequence mask where it starts before the largest first key, the new maxima (ca, cb: O's
    // rescale), s = 2^(s scale - max scale), the row sums into l
    auto softmax = [&](int k0) {
        if (cap_s > 0.f) {   // (a model's option: uniform over the launch)
#pragma unroll
            for (int j = 0; j < 64; ++j) s[j] = softcap(s[j], cap_s);
        }
        if (k0 + KEYS - 1 > it.tfirst.x || k0 < it.tlast.y) {
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                const int key = k0 + 8 * j + 2 * t4;
                if (key > lim_a || key < lo_a) s[4 * j] = -INFINITY;
                if (key + 1 > lim_a || key + 1 < lo_a) s[4 * j + 1] = -INFINITY;
                if (key > lim_b || key < lo_b) s[4 * j + 2] = -INFINITY;
                if (key + 1 > lim_b || key + 1 < lo_b) s[4 * j + 3] = -INFINITY;
            }
        }
        float mxa = -INFINITY, mxb = -INFINITY;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            mxa = fmaxf(mxa, fmaxf(s[4 * j], s[4 * j + 1]));
            mxb = fmaxf(mxb, fmaxf(s[4 * j + 2], s[4 * j + 3]));
        }
#pragma unroll
        for (int off = 1; off <= 2; off <<= 1) {
            mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, off));
            mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, off));
        }
        const float mna = fmaxf(m_a, mxa), mnb = fmaxf(m_b, mxb);
        // a row whose keys all lie in later tiles (a packed sequence starting after the item's
        // first) keeps max -inf: its reference max is 0 then, so ex2 gives 0, not NaN
        const float ua = mna == -INFINITY ? 0.f : mna, ub = mnb == -INFINITY ? 0.f : mnb;
        ca = ex2((m_a - ua) * scale_log2);
        cb = ex2((m_b - ub) * scale_log2);
        m_a = mna;
        m_b = mnb;
        const float ma_s = ua * scale_log2, mb_s = ub * scale_log2;
        float sa = 0.f, sb = 0.f;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            s[4 * j] = ex2(fmaf(s[4 * j], scale_log2, -ma_s));
            s[4 * j + 1] = ex2(fmaf(s[4 * j + 1], scale_log2, -ma_s));
            s[4 * j + 2] = ex2(fmaf(s[4 * j + 2], scale_log2, -mb_s));
            s[4 * j + 3] = ex2(fmaf(s[4 * j + 3], scale_log2, -mb_s));
            sa += s[4 * j] + s[4 * j + 1];
            sb += s[4 * j + 2] + s[4 * j + 3];
        }
        l_a = l_a * ca + sa;
        l_b = l_b * cb + sb;
    };
    // after the previous P V completed: O rescaled, this tile's P packed into pa
    auto rescale_pack = [&]() {
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            oacc[4 * j] *= ca;
            oacc[4 * j + 1] *= ca;
            oacc[4 * j + 2] *= cb;
            oacc[4 * j + 3] *= cb;
        }
#pragma unroll
        for (int ks = 0; ks < 8; ++ks) {
            pa[ks][0] = pack_h2(s[8 * ks], s[8 * ks + 1]);
            pa[ks][1] = pack_h2(s[8 * ks + 2], s[8 * ks + 3]);
            pa[ks][2] = pack_h2(s[8 * ks + 4], s[8 * ks + 5]);
            pa[ks][3] = pack_h2(s[8 * ks + 6], s[8 * ks + 7]);
        }
    };
    auto await_tile = [&](int ring) {
        wgmma::mbar_wait(full(ring), (ring / STAGES) & 1);
        wgmma::fence_proxy_async();   // cp.async writes (generic proxy) -> wgmma reads
    };
    // the turns: each S issue in turn (named barriers 1 + cw), handed over once issued; per
    // item warpgroup 1 opens (warpgroup 0 issues first) and its last issue hands over nothing,
    // so every item leaves both barriers as it found them
    auto turn_over = [&](int kt) {
        if (!(cw == 1 && kt + 1 == it.n_tiles)) bar_arrive(2 - cw);
    };

    int ring = 0;   // tiles consumed so far (all items): the ring's stage and phase
    for (int j = 0; item_at(j, tok, pos0, T, G, Hkv, window, it); ++j) {
        // the two rows this thread owns in the fragments (clamped: rows >= R compute, never
        // store)
        const int rwa = it.r0 + cw * 64 + warp * 16 + g, rwb = rwa + 8;
        {
            const int2 ta = tok_at(tok, pos0, min(rwa, R - 1) / G, window);
            const int2 tb = tok_at(tok, pos0, min(rwb, R - 1) / G, window);
            lim_a = ta.x, lim_b = tb.x, lo_a = ta.y, lo_b = tb.y;
        }
#pragma unroll
        for (int i = 0; i < D / 2; ++i) oacc[i] = 0.f;
        m_a = m_b = -INFINITY;
        l_a = l_b = 0.f;

        // Software pipeline (FlashAttention-3's intra-warpgroup overlap): tile kt's S = Q K^T
        // and tile kt - 1's O += P V are issued together; tile kt's softmax runs under that P V.
        if (cw == 1) bar_arrive(1);   // warpgroup 0 takes the first turn
        wgmma::mbar_wait(qfull(cw), j & 1);   // this warpgroup's Q rows
        await_tile(ring);
        bar_sync(1 + cw);
        wgmma::fence();
        issue_qk(stage(ring));
        wgmma::commit();
        turn_over(0);
        wgmma::wait<0>();
        wgmma::fence_regs(s);
        if (it.n_tiles == 1) wgmma::mbar_arrive(qempty(cw));   // Q read for the last time
        softmax(it.kt0 * KEYS);
        rescale_pack();
        for (int kt = 1; kt < it.n_tiles; ++kt) {
            await_tile(ring + kt);
            bar_sync(1 + cw);
            wgmma::fence();
            issue_qk(stage(ring + kt));
            wgmma::commit();
            issue_pv(stage(ring + kt - 1) + S::TILE);
            wgmma::commit();
            turn_over(kt);
            wgmma::wait<1>();   // S of tile kt
            wgmma::fence_regs(s);
            if (kt + 1 == it.n_tiles) wgmma::mbar_arrive(qempty(cw));   // the next item's Q
            softmax((it.kt0 + kt) * KEYS);
            wgmma::wait<0>();   // P V of tile kt - 1: O and pa are free, so is its stage
            wgmma::fence_regs(oacc);
            wgmma::mbar_arrive(empty(ring + kt - 1));
            rescale_pack();
        }
        ring += it.n_tiles;
        wgmma::fence();
        issue_pv(stage(ring - 1) + S::TILE);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::fence_regs(oacc);
        wgmma::mbar_arrive(empty(ring - 1));

#pragma unroll
        for (int off = 1; off <= 2; off <<= 1) {
            l_a += __shfl_xor_sync(0xffffffffu, l_a, off);
            l_b += __shfl_xor_sync(0xffffffffu, l_b, off);
        }
        const float ia = 1.f / l_a, ib = 1.f / l_b;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = h ? rwb : rwa;
            const int t = min(r, R - 1) / G, gh = min(r, R - 1) - t * G;
            const float inv = h ? ib : ia;
            if constexpr (D == 128) {
                if (ob != nullptr) {   // the operand of o's f16 values (every lane: shuffles)
                    float v[32];
#pragma unroll
                    for (int jj = 0; jj < 16; ++jj) {
                        const float2 f = __half22float2(__floats2half2_rn(
                            oacc[4 * jj + 2 * h] * inv, oacc[4 * jj + 2 * h + 1] * inv));
                        v[2 * jj] = f.x;
                        v[2 * jj + 1] = f.y;
                    }
                    row_operand(v, t4, r < R, t, it.hk * G + gh, Tp, ob);
                }
            }
            if (r >= R || o == nullptr) continue;
            __half* dst = o + (long)t * ldo + (long)(it.hk * G + gh) * D + 2 * t4;
#pragma unroll
            for (int jj = 0; jj < D / 8; ++jj)
                *reinterpret_cast<__half2*>(dst + 8 * jj) = __floats2half2_rn(
                    oacc[4 * jj + 2 * h] * inv, oacc[4 * jj + 2 * h + 1] * inv);
        }
    }
}

}  // namespace

#define ATT_WG_ENTRY(DD)                                                                       \
    extern "C" __global__ void __launch_bounds__(THREADS, 1)                                   \
        attn_wg_d##DD(const __half* q, long ldq, const __half* kc, const __half* vc, __half* o, \
                      long ldo, int T, int Hq, int Hkv, int pos0, const int2* tok,              \
                      float scale_log2, int window, float cap_s) {                             \
        attn_wg<DD>(q, ldq, kc, vc, o, ldo, T, Hq, Hkv, pos0, tok, scale_log2, window, cap_s); \
    }
ATT_WG_ENTRY(64)
ATT_WG_ENTRY(128)

// attn_wg_d*'s o with the full K/V tiles loaded by TMA (the caches as 2-D f16 [S, Hkv D] tensor
// maps mk, mv, box 64 x KEYS, 128-byte swizzle; a tile past the item's last key still by
// cp.async: its rows zero-filled), and (ob non-null) the token operand as attn_wg_d128_blk.
// The maps are 64-byte aligned parameters (gemm_f16_sm90a.cu's TMA_ENTRY: 48 bytes of padding
// first, minfer/cuda/runtime/tma.py TMA_PARAM_PAD); `magic` traps a mismatched argument layout.
#define ATT_WG_TMA_MAGIC 0x41545431
#define ATT_WG_TMA_ENTRY(DD)                                                                   \
    extern "C" __global__ void __launch_bounds__(THREADS, 1) attn_wg_tma_d##DD(                \
        const __grid_constant__ wgmma::TensorMap mk,                                           \
        const __grid_constant__ wgmma::TensorMap mv, const __half* q, long ldq,                \
        const __half* kc, const __half* vc, __half* o, long ldo, int T, int Hq, int Hkv,       \
        int pos0, const int2* tok, float scale_log2, int window, float cap_s, uint8_t* ob,     \
        int Tp, int magic) {                                                                   \
        if (magic != ATT_WG_TMA_MAGIC) __trap();                                               \
        attn_wg<DD>(q, ldq, kc, vc, o, ldo, T, Hq, Hkv, pos0, tok, scale_log2, window, cap_s,  \
                    DD == 128 ? ob : nullptr, Tp, &mk, &mv);                                   \
    }
ATT_WG_TMA_ENTRY(64)
ATT_WG_TMA_ENTRY(128)

// attn_wg_d128's o, and (ob non-null) the block path's token operand of o, [Hq, Tp / 128, OP],
// from the epilogue: what blk_operand_f16 makes of o, bit for bit (o may be null)
extern "C" __global__ void __launch_bounds__(THREADS, 1)
attn_wg_d128_blk(const __half* q, long ldq, const __half* kc, const __half* vc, __half* o,
                 long ldo, int T, int Hq, int Hkv, int pos0, const int2* tok, float scale_log2,
                 int window, float cap_s, uint8_t* ob, int Tp) {
    attn_wg<128>(q, ldq, kc, vc, o, ldo, T, Hq, Hkv, pos0, tok, scale_log2, window, cap_s, ob,
                 Tp);
}
