/*
 * fp8_step_cuda.cuh — the end of an FP8 step on the CUDA backend (model/dbrx_fp8_cuda.cuh's Fp8GPU): this step's
 * amaxes, saturation counts and dequantisation factors come back to the host in one copy each, roll into the
 * delayed recipe's histories (fp8_meta_step, the CPU's), and the next step's scales go up in one copy; a step the
 * spike guard skipped drops them; a checkpoint's restored scales go up. (Split from dbrx_fp8_cuda.cuh, which
 * includes it, to keep that file within the house rules' length.)
 */
#pragma once
#include "dbrx_fp8_cuda.cuh"

// Brings this step's amaxes, saturation counts and last dequantisation factors to the host metas
// (one copy each). Then the caller may reduce the amaxes across ranks (fp8_gpu_amaxes) and log.
static inline void fp8_gpu_collect(Fp8GPU* f) {
    if (!fp8_on(f) || f->collected) return;
    int n = f->nslots;
    std::vector<unsigned int> amax(n);
    std::vector<unsigned long long> sat(n);
    std::vector<float> sinv((size_t)n * FP8_SINV_STRIDE);
    cudaCheck(cudaMemcpy(amax.data(), f->amax, n * sizeof(unsigned int), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(sat.data(), f->sat, n * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(sinv.data(), f->scale_inv, sinv.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) {
        float a;
        memcpy(&a, &amax[i], sizeof a);
        f->metas[i].amax = a;
        f->metas[i].saturated = (long long)sat[i];
        f->last_scale[i] = f->cfg.recipe == FP8_BLOCK ? 1.0f : 1.0f / sinv[(size_t)FP8_SINV_STRIDE * i];
    }
    f->collected = true;
}

// End of step: this step's (rank-reduced) amaxes roll into the histories (fp8_meta_step, the CPU's),
// the next step's scales go to the device, the step's amax and saturation counters restart.
static inline void fp8_gpu_step(Fp8GPU* f) {
    if (!fp8_on(f)) return;
    fp8_gpu_collect(f);
    fp8_gpu_weights_changed(f);   // (the optimizer has just updated them)
    std::vector<float> scale(f->nslots);
    for (int i = 0; i < f->nslots; i++) {
        fp8_meta_step(&f->metas[i], &f->cfg, f->fmts[i]);
        scale[i] = f->metas[i].scale;
    }
    cudaCheck(cudaMemcpy(f->scale, scale.data(), f->nslots * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemset(f->amax, 0, f->nslots * sizeof(unsigned int)));
    cudaCheck(cudaMemset(f->sat, 0, f->nslots * sizeof(unsigned long long)));
    f->collected = false;
}

// A step the spike guard skipped: its amaxes and saturation counts are dropped, the histories and scales
// stay as they were
static inline void fp8_gpu_discard_step(Fp8GPU* f) {
    if (!fp8_on(f)) return;
    fp8_gpu_weights_changed(f);   // (unchanged, but the step's amaxes are dropped: the next step records them again)
    for (int i = 0; i < f->nslots; i++) { f->metas[i].amax = 0; f->metas[i].saturated = 0; }
    cudaCheck(cudaMemset(f->amax, 0, f->nslots * sizeof(unsigned int)));
    cudaCheck(cudaMemset(f->sat, 0, f->nslots * sizeof(unsigned long long)));
    f->collected = false;
}

// The host metas' scales -> the device (after a checkpoint restored them: checkpoint/fp8_state.h)
static inline void fp8_gpu_upload_scales(Fp8GPU* f) {
    if (!fp8_on(f)) return;
    fp8_gpu_weights_changed(f);   // (restored with new weights)
    std::vector<float> scale(f->nslots);
    for (int i = 0; i < f->nslots; i++) scale[i] = f->metas[i].scale;
    cudaCheck(cudaMemcpy(f->scale, scale.data(), f->nslots * sizeof(float), cudaMemcpyHostToDevice));
}
