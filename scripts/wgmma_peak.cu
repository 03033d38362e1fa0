// wgmma_peak.cu: a diagnostic microbenchmark (scripts/wgmma_peak.py), not an engine kernel.
// 2 (or 3) warpgroups per block issue back-to-back int8 wgmmas m64nNk32 from shared memory
// (pseudo-random operands, 128-byte swizzle) in groups of G, waiting for the previous group; the
// block's clock64 span gives the tensor rate per SM.
#include <stdint.h>
#include "../kernels/wgmma_common.cuh"

extern __shared__ __align__(1024) uint8_t sm[];

// nonzero pseudo-random operands in the block's 64 KB (the tensor rate must not see zeros)
__device__ __forceinline__ void fill_smem() {
    uint32_t* w = reinterpret_cast<uint32_t*>(sm);
    for (int i = threadIdx.x; i < 64 * 1024 / 4; i += blockDim.x)
        w[i] = (i * 2654435761u) ^ 0x5bd1e995u ^ (blockIdx.x << 7);
}

// d = (ACC ? d : 0) + A B
template <int ACC = 1>
__device__ __forceinline__ void ig(int (&d)[64], uint64_t a, uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.u8.u8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, %66;\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
        : "l"(a), "l"(b), "n"(ACC));
}



// the loops' shared pieces: the 1 KB-aligned tile base, chunk q's m64n128k32 of warpgroup wg
// (A: its 64 rows, B: the 128 tokens; 4 k-steps cycled), the 64-FFMA fold of one chunk, and the
// report (the block's clock span; a sink keeps every result alive)
__device__ __forceinline__ uint32_t tile_base() {
    return (gemm_f16::smem_u32(sm) + 1023) & ~1023u;
}
template <int ACC>
__device__ __forceinline__ void chunk(int (&d)[64], uint32_t base, int wg, int q) {
    ig<ACC>(d, wgmma::sw128_desc(base + wg * 8192 + (q & 3) * 32),
            wgmma::sw128_desc(base + 16384 + (q & 3) * 32));
}
__device__ __forceinline__ void fold64(float (&z)[64], const int (&d)[64], float m0, float m8) {
#pragma unroll
    for (int k = 0; k < 64; ++k) z[k] = fmaf(__int_as_float(d[k]), (k & 2) ? m8 : m0, z[k]);
}
// registers set (nonzero accumulators, z = 0) and the operands written before the clock starts
__device__ __forceinline__ void start(int (&da)[64], int (&db)[64], float (&z)[64]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) { da[i] = i; db[i] = 2 * i; z[i] = 0.f; }
    fill_smem();
    __syncthreads();
}
__device__ __forceinline__ void report(long long* cyc, int* sink, const float (&z)[64],
                                       const int (&da)[64], const int (&db)[64], long long t0,
                                       long long t1) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 64; ++i) s += z[i] + (float)da[i] + (float)db[i];
    if (s == 12345.f) sink[0] = 1;
    if (threadIdx.x == 0) cyc[blockIdx.x] = t1 - t0;
}

__device__ __forceinline__ void ig(int (&d)[128], uint64_t a, uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n256k32.s32.u8.u8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, 1;\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63]), "+r"(d[64]), "+r"(d[65]), "+r"(d[66]), "+r"(d[67]), "+r"(d[68]), "+r"(d[69]), "+r"(d[70]), "+r"(d[71]), "+r"(d[72]), "+r"(d[73]), "+r"(d[74]), "+r"(d[75]), "+r"(d[76]), "+r"(d[77]), "+r"(d[78]), "+r"(d[79]), "+r"(d[80]), "+r"(d[81]), "+r"(d[82]), "+r"(d[83]), "+r"(d[84]), "+r"(d[85]), "+r"(d[86]), "+r"(d[87]), "+r"(d[88]), "+r"(d[89]), "+r"(d[90]), "+r"(d[91]), "+r"(d[92]), "+r"(d[93]), "+r"(d[94]), "+r"(d[95]), "+r"(d[96]), "+r"(d[97]), "+r"(d[98]), "+r"(d[99]), "+r"(d[100]), "+r"(d[101]), "+r"(d[102]), "+r"(d[103]), "+r"(d[104]), "+r"(d[105]), "+r"(d[106]), "+r"(d[107]), "+r"(d[108]), "+r"(d[109]), "+r"(d[110]), "+r"(d[111]), "+r"(d[112]), "+r"(d[113]), "+r"(d[114]), "+r"(d[115]), "+r"(d[116]), "+r"(d[117]), "+r"(d[118]), "+r"(d[119]), "+r"(d[120]), "+r"(d[121]), "+r"(d[122]), "+r"(d[123]), "+r"(d[124]), "+r"(d[125]), "+r"(d[126]), "+r"(d[127])
        : "l"(a), "l"(b));
}

// the bare stream: R accumulator registers (m64n{2R}k32), groups of 4 wgmmas, wait 1
template <int R>
__device__ __forceinline__ void peak(long long* cyc, int iters, int* sink) {
    const uint32_t base = tile_base();
    const int wg = threadIdx.x >> 7;
    int d[R];
#pragma unroll
    for (int i = 0; i < R; ++i) d[i] = 0;
    fill_smem();
    __syncthreads();
    const long long t0 = clock64();
    for (int it = 0; it < iters; ++it) {
        wgmma::fence();
#pragma unroll
        for (int c = 0; c < 4; ++c)
            ig(d, wgmma::sw128_desc(base + wg * 8192 + c * 32), wgmma::sw128_desc(base + 16384 + c * 32));
        wgmma::commit();
        wgmma::wait<1>();
    }
    wgmma::wait<0>();
    wgmma::fence_regs(d);
    const long long t1 = clock64();
    int s = 0;
#pragma unroll
    for (int i = 0; i < R; ++i) s += d[i];
    if (s == 12345) sink[0] = s;
    if (threadIdx.x == 0) cyc[blockIdx.x] = t1 - t0;
}

extern "C" __global__ void __launch_bounds__(256, 1) wgmma_peak128(long long* cyc, int iters, int* sink) {
    peak<64>(cyc, iters, sink);
}
extern "C" __global__ void __launch_bounds__(256, 1) wgmma_peak256(long long* cyc, int iters, int* sink) {
    peak<128>(cyc, iters, sink);
}

// mmq_sb_q4k.cu's inner loop without copies: per chunk one m64n128k32 into buffer q % 2 and the
// previous chunk's fold (64 FFMA with the row factor of the thread's 2 rows), 8 chunks a
// super-block, the super-block's last fold after a wait 0 (nothing in flight across the loop
// edge). MODE 0: as the kernel (the fold reads the wgmma's accumulators); 1: the wgmmas alone;
// 2: the folds alone (no wgmma: the same FFMAs on accumulators nobody writes); 3: the wgmmas and
// as many FFMAs that read none of the accumulators (z = z m + c): does the FFMA stream overlap
// the tensor work when it does not depend on it?
template <int MODE>
__device__ __forceinline__ void fold_loop(long long* cyc, int iters, int* sink, float m0, float m8) {
    const uint32_t base = tile_base();
    const int wg = threadIdx.x >> 7;
    int da[64], db[64];
    float z[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) { da[i] = 0; db[i] = 0; z[i] = 0.f; }
    fill_smem();
    __syncthreads();
    // (modes 1 and 3 accumulate, d += A B: with nothing reading a wgmma's result before the next
    // write, ptxas deletes the overwriting form)
    auto mma = [&](int (&d)[64], int q) {
        if (MODE == 0) chunk<0>(d, base, wg, q);
        else if (MODE != 2) chunk<1>(d, base, wg, q);
    };
    auto fold = [&](int (&d)[64]) {
        wgmma::fence_regs(d);
        if constexpr (MODE != 1) {
#pragma unroll
            for (int k = 0; k < 64; ++k)
                z[k] = MODE == 3 ? fmaf(z[k], (k & 2) ? m8 : m0, 0.5f)
                                 : fmaf(__int_as_float(d[k]), (k & 2) ? m8 : m0, z[k]);
        }
    };
    const long long t0 = clock64();
    for (int it = 0; it < iters; ++it) {
        wgmma::fence();
        mma(da, 0);
        wgmma::commit();
#pragma unroll
        for (int q = 1; q < 8; ++q) {
            wgmma::fence();
            mma(q & 1 ? db : da, q);
            wgmma::commit();
            wgmma::wait<1>();
            if (q & 1) fold(da);
            else fold(db);
        }
        wgmma::wait<0>();
        fold(db);
    }
    const long long t1 = clock64();
    report(cyc, sink, z, da, db, t0, t1);
}

// a loop's entry: NAME(cyc, iters, sink, m0, m8) with THREADS threads, 1 block per SM
#define LOOP_ENTRY(NAME, THREADS, LOOP)                                                        \
    extern "C" __global__ void __launch_bounds__(THREADS, 1)                                   \
        NAME(long long* cyc, int iters, int* sink, float m0, float m8) {                       \
        LOOP(cyc, iters, sink, m0, m8);                                                        \
    }

LOOP_ENTRY(wgmma_fold128, 256, fold_loop<0>)
LOOP_ENTRY(wgmma_nofold128, 256, fold_loop<1>)
LOOP_ENTRY(ffma_fold128, 256, fold_loop<2>)
LOOP_ENTRY(wgmma_indep128, 256, fold_loop<3>)

// Where does the FFMA stream collide with the tensor work? (session 10)
// MODE 4 (384 threads): warpgroups 0, 1 issue only the wgmmas (mode 1's loop), warpgroup 2 only
// FFMAs, twice mode 2's folds per iteration (one warp per scheduler instead of two, so the same
// FP32 issue per scheduler): do FFMAs of warps with no wgmma in flight overlap the tensor work?
// MODE 5: ping-pong. The two warpgroups take turns on the tensor core (named barriers 2, 3): a
// turn is two chunks (m64n128k32 into da, db), wait 0, hand the turn over, then fold both while
// the other warpgroup's wgmmas run, so no warp folds under its own wgmma. MODE 6: the same work
// in step (no barriers).
template <int MODE>
__device__ __forceinline__ void turn_loop(long long* cyc, int iters, int* sink, float m0, float m8) {
    const uint32_t base = tile_base();
    const int wg = threadIdx.x >> 7;
    int da[64], db[64];
    float z[64];
    start(da, db, z);
    auto mma0 = [&](int (&d)[64], int q) { chunk<0>(d, base, wg & 1, q); };
    auto fold = [&](const int (&d)[64]) { fold64(z, d, m0, m8); };
    const long long t0 = clock64();
    if (MODE == 4) {
        if (wg < 2) {
            for (int it = 0; it < iters; ++it) {
                wgmma::fence();
#pragma unroll
                for (int q = 0; q < 8; ++q) {
                    chunk<1>(da, base, wg, q);
                    wgmma::commit();
                    if (q) wgmma::wait<1>();
                }
                wgmma::wait<0>();
            }
            wgmma::fence_regs(da);
        } else {
            for (int it = 0; it < iters; ++it) {
#pragma unroll
                for (int q = 0; q < 16; ++q) {
                    fold(q & 1 ? db : da);
                    asm volatile("" : "+r"(da[q & 63]));   // keep the loop from collapsing
                }
            }
        }
    } else {
        if (MODE == 5 && wg == 1) asm volatile("bar.arrive 2, 256;\n" ::: "memory");
        for (int it = 0; it < iters; ++it) {
#pragma unroll
            for (int q = 0; q < 8; q += 2) {
                if (MODE == 5) asm volatile("bar.sync %0, 256;\n" ::"r"(2 + wg) : "memory");
                wgmma::fence();
                mma0(da, q);
                mma0(db, q + 1);
                wgmma::commit();
                wgmma::wait<0>();
                if (MODE == 5) asm volatile("bar.arrive %0, 256;\n" ::"r"(3 - wg) : "memory");
                wgmma::fence_regs(da);
                wgmma::fence_regs(db);
                fold(da);
                fold(db);
            }
        }
        if (MODE == 5 && wg == 0) asm volatile("bar.sync 2, 256;\n" ::: "memory");
    }
    __syncthreads();
    const long long t1 = clock64();
    report(cyc, sink, z, da, db, t0, t1);
}

LOOP_ENTRY(wgmma_thirdwg128, 384, turn_loop<4>)
LOOP_ENTRY(wgmma_pingpong128, 256, turn_loop<5>)
LOOP_ENTRY(wgmma_instep128, 256, turn_loop<6>)

// The super-block edge (session 10): mode 0's loop with a 64-FFMA "rescale" per super-block (as
// the kernel's z = z r + b). PIPE 0: the rescale before chunk 0 and wait 0 at the end of every
// super-block (as the kernel: nothing in flight across the loop edge, where ptxas would
// serialize the wgmmas); PIPE 1: two super-blocks per iteration, the edge between them
// pipelined (the next chunk 0 issued before the last fold and the rescale), wait 0 only at the
// iteration's end. iters counts super-blocks.
template <int PIPE>
__device__ __forceinline__ void edge_loop(long long* cyc, int iters, int* sink, float m0, float m8) {
    const uint32_t base = tile_base();
    const int wg = threadIdx.x >> 7;
    int da[64], db[64];
    float z[64];
    start(da, db, z);
    auto mma = [&](int (&d)[64], int q) { chunk<0>(d, base, wg, q); };
    auto fold = [&](int (&d)[64]) {
        wgmma::fence_regs(d);
        fold64(z, d, m0, m8);
    };
    auto rescale = [&]() {
#pragma unroll
        for (int k = 0; k < 64; ++k) z[k] = fmaf(z[k], (k & 1) ? m0 : m8, 0.25f);
    };
    // chunks 1..7 of a super-block whose chunk 0 is in flight in da
    auto body = [&]() {
#pragma unroll
        for (int q = 1; q < 8; ++q) {
            wgmma::fence();
            mma(q & 1 ? db : da, q);
            wgmma::commit();
            wgmma::wait<1>();
            if (q & 1) fold(da);
            else fold(db);
        }
    };
    const long long t0 = clock64();
    for (int it = 0; it < iters; it += 1 + PIPE) {
        rescale();
        wgmma::fence();
        mma(da, 0);
        wgmma::commit();
        body();
        if (PIPE) {   // the edge inside the iteration: c0 of the second super-block first
            wgmma::fence();
            mma(da, 0);
            wgmma::commit();
            wgmma::wait<1>();
            fold(db);
            rescale();
            body();
        }
        wgmma::wait<0>();
        fold(db);
    }
    const long long t1 = clock64();
    report(cyc, sink, z, da, db, t0, t1);
}

LOOP_ENTRY(wgmma_edge128, 256, edge_loop<0>)
LOOP_ENTRY(wgmma_edgepipe128, 256, edge_loop<1>)
