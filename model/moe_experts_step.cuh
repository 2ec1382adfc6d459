/*
 * moe_experts_step.cuh — the experts' GEMMs as the training step runs them (block_experts_forward / _backward and the
 * recomputation): per expert on cuBLASLt (model/moe.cuh, the default) or, under --moe-gemm grouped, one grouped launch
 * per projection for all experts (model/moe_grouped_tma.cuh: the forward and the data gradients; model/moe_grouped_wgrad.cuh:
 * the weight gradients). Under the emulator both paths give the same bits (test_moe_grouped, test_moe_wgrad, test_moe_gemm.sh).
 */
#pragma once
#include "moe_grouped_wgrad.cuh"

// the experts' forward as the training step runs it: ye (null: g, u and a only) from xe grouped by expert. Under
// --moe-gemm grouped moe_grouped_tma.cuh's kernels (offsets_dev; rows: xe's and a's allocated rows), else experts_forward_gpu expert
// by expert (offsets_host). Under the emulator both give the same bits (test_moe_grouped); on a GPU their summation
// orders differ, so the recomputation (--recompute) calls this too. The down-projection's tiles: 256 columns when d allows
static inline void experts_forward_step_gpu(floatX* ye, floatX* g, floatX* u, floatX* a, const floatX* xe, const floatX* w1,
                                            const floatX* v1, const floatX* w2, const int* offsets_dev, const int* offsets_host,
                                            int rows, int E, int d, int F) {
    if (!g_moe_grouped) { experts_forward_gpu(ye, g, u, a, xe, w1, v1, w2, offsets_host, E, d, F); return; }
    experts_up_grouped_tma_gpu(g, u, a, xe, w1, v1, offsets_dev, rows, E, d, F);
    if (ye && d % 256 == 0) experts_down_grouped_tma_gpu<256>(ye, a, w2, offsets_dev, rows, E, d, F);
    else if (ye) experts_down_grouped_tma_gpu<128>(ye, a, w2, offsets_dev, rows, E, d, F);
}
// the experts' backward as the training step runs it (experts_backward_gpu's arguments; rows: dye's, dg's, du's, dxe's
// allocated rows). Under --moe-gemm grouped all on grouped kernels, the offsets read on the device: the data gradients
// (moe_grouped_tma.cuh: dg, du with the SwiGLU backward fused, da not written; then dxe) and the three weight gradients
// (moe_grouped_wgrad.cuh). offsets_host: the per-expert path's only
static inline void experts_backward_step_gpu(floatX* dxe, float* dw1, float* dv1, float* dw2, floatX* da, floatX* dg, floatX* du,
                                             const floatX* dye, const floatX* xe, const floatX* g, const floatX* u, const floatX* a,
                                             const floatX* w1, const floatX* v1, const floatX* w2, const int* offsets_dev,
                                             const int* offsets_host, int rows, int E, int d, int F, float wbeta) {
    if (!g_moe_grouped) {
        experts_backward_gpu(dxe, dw1, dv1, dw2, da, dg, du, dye, xe, g, u, a, w1, v1, w2, offsets_host, E, d, F, 0, wbeta);
        return;
    }
    experts_down_backward_grouped_tma_gpu(dg, du, nullptr, dye, w2, g, u, offsets_dev, rows, E, d, F);
    experts_up_backward_grouped_tma_gpu(dxe, dg, du, w1, v1, offsets_dev, rows, E, d, F);
    experts_wgrad_grouped_all_gpu(dw1, dv1, dw2, dg, du, a, xe, dye, offsets_dev, rows, E, d, F, wbeta);
}
