// gemma_layers.cu: the small ops gemma2 / gemma3 add to the llama forward (llama.cpp
// src/models/gemma2.cpp, gemma3.cpp). Numpy twins in minfer/reference (ops.gelu / ops.geglu,
// ops.rmsnorm, ReferenceBackend._embed / _head); launchers: minfer/cuda/ops/gemma_layers.py.
//
// Entries:
//   scale_f32          y[n] *= s                        the embeddings times sqrt(d_model)
//   geglu_f32_f16      y f16 [T, F] = gelu(g) * u       g/u f32 rows of stride ldg (the fused
//                                                       gate|up output: u = g + F, ldg = 2F);
//                                                       grid (ceil(F/256), T), block (256)
//   rmsnorm_add_f32    x[T, D] += rmsnorm(t) * w        t f32 [T, D]: the attention / FFN output
//                                                       (post_attention_norm, post_ffw_norm)
//                                                       before the residual add; grid (T), 256
//   softcap_f32        y[n] = tanh(y * (1 / cap)) * cap final logit soft-capping (1 / cap: inv)
//   scale_add_f32      x[n] += t[n] * s                 granite's residual_scale: the attention
//                                                       / FFN output scaled before its residual add
// Each product the reference rounds on its own is __fmul_rn / __fadd_rn (no FMA contraction).
#include <cuda_fp16.h>
#include <stdint.h>

#include "rmsnorm.cuh"   // rms_scale, rms_value
#include "swiglu.cuh"    // glu_rows_f32_f16: the glu GEMM epilogue's rounding too

extern "C" __global__ void scale_f32(float* y, long n, float s) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __fmul_rn(y[i], s);
}

extern "C" __global__ void geglu_f32_f16(__half* y, long ldy, const float* g, const float* u,
                                         long ldg, int F) {
    glu_rows_f32_f16<1>(y, ldy, g, u, ldg, F);
}

// in place on x is safe: t is another buffer, and each thread adds only the values it reads
extern "C" __global__ void rmsnorm_add_f32(float* x, const float* t, const float* w, int D,
                                           float eps) {
    const float* tr = t + (size_t)blockIdx.x * D;
    float* xr = x + (size_t)blockIdx.x * D;
    const float scale = rms_scale(tr, D, eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        xr[i] = __fadd_rn(xr[i], rms_value(tr[i], scale, w[i]));
}

extern "C" __global__ void softcap_f32(float* y, long n, float cap, float inv) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __fmul_rn(tanhf(__fmul_rn(y[i], inv)), cap);
}

// granite: x = x + t * s, the product rounded first (ggml_scale, then ggml_add)
extern "C" __global__ void scale_add_f32(float* x, const float* t, long n, float s) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fadd_rn(x[i], __fmul_rn(t[i], s));
}
