// quant_blocks.cuh: ggml's GGUF block layouts (QK_K = 256) and minfer's q8_1 raw activation
// block, as plain C++ structs pinned by static_assert on sizeof and every field offset.
// Pure C++ (no CUDA types): the host compiler can check it too. f16 fields are stored as
// uint16_t bits (ggml_half). Mirrored by numpy dtypes in minfer/quants/layouts.py and checked
// by tests/test_quant_layouts.py, which parses the static_asserts below
// (keep them one per line: `static_assert(sizeof(T) == n, ...)`, `static_assert(offsetof(T, f) == n, ...)`).
#pragma once
#include <stddef.h>
#include <stdint.h>

#define MINFER_QK_K 256
#define MINFER_K_SCALE_SIZE 12

typedef uint16_t f16_bits;  // IEEE half, raw bits

// ---- 32-weight blocks ------------------------------------------------------------------
struct block_q4_0 {  // w = d * (q - 8), q = nibble; low nibbles are weights 0..15
    f16_bits d;
    uint8_t qs[16];
};
static_assert(sizeof(block_q4_0) == 18, "q4_0 size");
static_assert(offsetof(block_q4_0, d) == 0, "q4_0 d");
static_assert(offsetof(block_q4_0, qs) == 2, "q4_0 qs");

struct block_q4_1 {  // w = d * q + m
    f16_bits d;
    f16_bits m;
    uint8_t qs[16];
};
static_assert(sizeof(block_q4_1) == 20, "q4_1 size");
static_assert(offsetof(block_q4_1, d) == 0, "q4_1 d");
static_assert(offsetof(block_q4_1, m) == 2, "q4_1 m");
static_assert(offsetof(block_q4_1, qs) == 4, "q4_1 qs");

struct block_q5_0 {  // w = d * (q - 16), q = nibble | bit i of qh << 4
    f16_bits d;
    uint8_t qh[4];
    uint8_t qs[16];
};
static_assert(sizeof(block_q5_0) == 22, "q5_0 size");
static_assert(offsetof(block_q5_0, d) == 0, "q5_0 d");
static_assert(offsetof(block_q5_0, qh) == 2, "q5_0 qh");
static_assert(offsetof(block_q5_0, qs) == 6, "q5_0 qs");

struct block_q5_1 {  // w = d * q + m
    f16_bits d;
    f16_bits m;
    uint8_t qh[4];
    uint8_t qs[16];
};
static_assert(sizeof(block_q5_1) == 24, "q5_1 size");
static_assert(offsetof(block_q5_1, d) == 0, "q5_1 d");
static_assert(offsetof(block_q5_1, m) == 2, "q5_1 m");
static_assert(offsetof(block_q5_1, qh) == 4, "q5_1 qh");
static_assert(offsetof(block_q5_1, qs) == 8, "q5_1 qs");

struct block_q8_0 {  // w = q * d
    f16_bits d;
    int8_t qs[32];
};
static_assert(sizeof(block_q8_0) == 34, "q8_0 size");
static_assert(offsetof(block_q8_0, d) == 0, "q8_0 d");
static_assert(offsetof(block_q8_0, qs) == 2, "q8_0 qs");

struct block_iq4_nl {  // w = d * kvalues_iq4nl[nibble]
    f16_bits d;
    uint8_t qs[16];
};
static_assert(sizeof(block_iq4_nl) == 18, "iq4_nl size");
static_assert(offsetof(block_iq4_nl, d) == 0, "iq4_nl d");
static_assert(offsetof(block_iq4_nl, qs) == 2, "iq4_nl qs");

// minfer's q8_1 raw activation block (docs/design.md): 40 B per 32 values, written by the quantize
// prepass; s = sum of the 32 int8 values (free to compute there, used by the MMQ min fold).
struct block_q8_1_raw {
    f16_bits d;     // +0
    uint16_t pad;   // +2, zero
    int8_t qs[32];  // +4
    int32_t s;      // +36
};
static_assert(sizeof(block_q8_1_raw) == 40, "q8_1_raw size");
static_assert(offsetof(block_q8_1_raw, d) == 0, "q8_1_raw d");
static_assert(offsetof(block_q8_1_raw, pad) == 2, "q8_1_raw pad");
static_assert(offsetof(block_q8_1_raw, qs) == 4, "q8_1_raw qs");
static_assert(offsetof(block_q8_1_raw, s) == 36, "q8_1_raw s");

// ---- 256-weight super-blocks (k-quants, iq4_xs) ----------------------------------------------
struct block_q2_K {  // w = d*(sc&15) * q - dmin*(sc>>4), 16 sub-blocks of 16
    uint8_t scales[16];
    uint8_t qs[64];
    f16_bits d;
    f16_bits dmin;
};
static_assert(sizeof(block_q2_K) == 84, "q2_K size");
static_assert(offsetof(block_q2_K, scales) == 0, "q2_K scales");
static_assert(offsetof(block_q2_K, qs) == 16, "q2_K qs");
static_assert(offsetof(block_q2_K, d) == 80, "q2_K d");
static_assert(offsetof(block_q2_K, dmin) == 82, "q2_K dmin");

struct block_q3_K {  // w = d*(sc-32) * (q2 - 4*!hbit), 16 sub-blocks of 16, 6-bit scales
    uint8_t hmask[32];
    uint8_t qs[64];
    uint8_t scales[12];
    f16_bits d;
};
static_assert(sizeof(block_q3_K) == 110, "q3_K size");
static_assert(offsetof(block_q3_K, hmask) == 0, "q3_K hmask");
static_assert(offsetof(block_q3_K, qs) == 32, "q3_K qs");
static_assert(offsetof(block_q3_K, scales) == 96, "q3_K scales");
static_assert(offsetof(block_q3_K, d) == 108, "q3_K d");

struct block_q4_K {  // w = d*sc * q - dmin*m, 8 sub-blocks of 32 (get_scale_min_k4)
    f16_bits d;
    f16_bits dmin;
    uint8_t scales[12];
    uint8_t qs[128];
};
static_assert(sizeof(block_q4_K) == 144, "q4_K size");
static_assert(offsetof(block_q4_K, d) == 0, "q4_K d");
static_assert(offsetof(block_q4_K, dmin) == 2, "q4_K dmin");
static_assert(offsetof(block_q4_K, scales) == 4, "q4_K scales");
static_assert(offsetof(block_q4_K, qs) == 16, "q4_K qs");

struct block_q5_K {  // as q4_K with a 5th bit per weight in qh
    f16_bits d;
    f16_bits dmin;
    uint8_t scales[12];
    uint8_t qh[32];
    uint8_t qs[128];
};
static_assert(sizeof(block_q5_K) == 176, "q5_K size");
static_assert(offsetof(block_q5_K, d) == 0, "q5_K d");
static_assert(offsetof(block_q5_K, dmin) == 2, "q5_K dmin");
static_assert(offsetof(block_q5_K, scales) == 4, "q5_K scales");
static_assert(offsetof(block_q5_K, qh) == 16, "q5_K qh");
static_assert(offsetof(block_q5_K, qs) == 48, "q5_K qs");

struct block_q6_K {  // w = d*scales[i] * (q - 32), 16 sub-blocks of 16, q 6 bits
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    f16_bits d;
};
static_assert(sizeof(block_q6_K) == 210, "q6_K size");
static_assert(offsetof(block_q6_K, ql) == 0, "q6_K ql");
static_assert(offsetof(block_q6_K, qh) == 128, "q6_K qh");
static_assert(offsetof(block_q6_K, scales) == 192, "q6_K scales");
static_assert(offsetof(block_q6_K, d) == 208, "q6_K d");

struct block_iq4_xs {  // w = d*(sc-32) * kvalues_iq4nl[nibble], 8 sub-blocks of 32
    f16_bits d;
    uint16_t scales_h;
    uint8_t scales_l[4];
    uint8_t qs[128];
};
static_assert(sizeof(block_iq4_xs) == 136, "iq4_xs size");
static_assert(offsetof(block_iq4_xs, d) == 0, "iq4_xs d");
static_assert(offsetof(block_iq4_xs, scales_h) == 2, "iq4_xs scales_h");
static_assert(offsetof(block_iq4_xs, scales_l) == 4, "iq4_xs scales_l");
static_assert(offsetof(block_iq4_xs, qs) == 8, "iq4_xs qs");
