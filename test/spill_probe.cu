/*
 * spill_probe.cu — the negative control of the build's no-spill rule (Makefile: NVCC_NOSPILL, ptxas's
 * -warn-spills as an error on the kernels of the training step). A kernel with 64 live floats per thread,
 * capped by its launch bounds at 32 registers, must spill, and the build must then fail naming it
 * (test/run_all.sh compiles this with the same flags and expects the error).
 */
__global__ void __launch_bounds__(1024, 2) spill_probe(float* out, const float* in, int n) {
    float v[64];
    #pragma unroll
    for (int i = 0; i < 64; i++) v[i] = in[(threadIdx.x + i * 131) % n];
    float acc = 0;
    #pragma unroll
    for (int r = 0; r < 8; r++)
        #pragma unroll
        for (int i = 0; i < 64; i++) { v[i] = v[i] * v[(i + r + 1) % 64] + 1.0f; acc += v[i]; }
    out[threadIdx.x] = acc;
}
