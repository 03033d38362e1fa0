// dequant_host.cu: runs kernels/dequant.cu's per-type decoders (Type::dq8) on the CPU, so CI
// (no GPU) checks the bit-level decode of every type against gguf. Built as a shared library
// by tests/test_dequant_host.py and called through ctypes.
// Entry: dq_host(type_name, src, n_elems, out): out[0..n_elems) = f32 weights of the flat
// block run at src (for f32/f16/bf16 src must have 16 bytes of slack past its end).
#define MINFER_DQ_DECODERS_ONLY
#include "../../kernels/dequant.cu"

template <class T>
static void run(const uint8_t* src, long long n, float* out) {
    for (long long e0 = 0; e0 < n; e0 += 8) {
        float v[8];
        T::dq8(src + (e0 / T::QK) * T::TS, int((e0 % T::QK) / 8), v);
        for (long long k = 0; k < 8 && e0 + k < n; ++k) out[e0 + k] = v[k];
    }
}

extern "C" int dq_host(const char* t, const uint8_t* src, long long n, float* out) {
#define CASE(name, T)                \
    if (strcmp(t, #name) == 0) {     \
        run<T>(src, n, out);         \
        return 0;                    \
    }
    CASE(f32, T_F32) CASE(f16, T_F16) CASE(bf16, T_BF16) CASE(q4_0, T_Q4_0) CASE(q4_1, T_Q4_1)
    CASE(q5_0, T_Q5_0) CASE(q5_1, T_Q5_1) CASE(q8_0, T_Q8_0) CASE(q2_K, T_Q2_K)
    CASE(q3_K, T_Q3_K) CASE(q4_K, T_Q4_K) CASE(q5_K, T_Q5_K) CASE(q6_K, T_Q6_K)
    CASE(iq4_nl, T_IQ4_NL) CASE(iq4_xs, T_IQ4_XS)
#undef CASE
    return 1;
}
