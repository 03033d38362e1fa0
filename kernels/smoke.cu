// smoke.cu: y[i] = a * x[i] + y[i] (f32), the build pipeline's own test kernel; and a spin
// that holds the stream for a number of clock cycles (timing scripts queue a batch of launches
// behind it, so a batch runs back to back instead of at the host's launch rate).
// Entries: axpy_f32, spin_cycles.
extern "C" __global__ void axpy_f32(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void spin_cycles(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}
