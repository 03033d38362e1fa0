// smoke.cu: y[i] = a * x[i] + y[i] (f32). The build pipeline's own test kernel.
// Entries: axpy_f32.
extern "C" __global__ void axpy_f32(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
