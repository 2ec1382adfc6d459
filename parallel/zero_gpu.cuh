/*
 * zero_gpu.cuh — the GPU side of ZeRO-3/HSDP. parallel/zero.h has the layout (units, shards,
 * segments), the groups and the CPU path; this file keeps the state in device memory and overlaps the
 * communication with compute:
 *   - fp32 master, gradient and AdamW moment shards in device memory, plus a bf16 copy of the master
 *     shard (the all-gather's input; refreshed by zero_gpu_refresh_bf16 after every optimizer step);
 *   - two bf16 working slots (unit u in slot u % 2) and two fp32 gradient slots;
 *   - gathers and reduce-scatters run on the shard group's NCCL stream (the communication stream) and
 *     are ordered against the compute stream with events: while unit u computes, unit u+1 (forward)
 *     or u-1 (backward) is gathered into the other slot.
 * Use from a GPU forward/backward, per unit, the same calls the CPU hooks make:
 *   p = zero_gpu_unit_begin(zg, u, phase)  -> the unit's bf16 parameters (its range of the flat buffer);
 *                                             also starts the next unit's gather
 *   g = zero_gpu_unit_grads(zg, u)         -> a zeroed fp32 buffer for the unit's gradients (backward)
 *   zero_gpu_unit_end(zg, u, phase)        -> releases the slot; in backward, reduce-scatters g into the
 *                                             gradient shard on the communication stream
 *   zero_gpu_reduce_grads(zg)              -> after the last micro-batch: all-reduce across replicas, / W
 * Checkpoints and Hugging Face import fill z's host shards, which zero_gpu_init copies up; before a save
 * or an export, zero_gpu_to_host copies the device shards down (checkpoint/ckpt.h then copies them to its
 * staging buffer and writes in the background).
 * STATUS: compiled by nvcc in the CUDA build; not run (no GPU was available while writing it). The
 * optimizer step on the shard (norm, AdamW over zg->z->segs) belongs to the GPU training path.
 */
#pragma once
#include <cuda_bf16.h>
#include "zero.h"

#define ZCUDA_CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) \
    fail_at(__FILE__, __LINE__, "CUDA error: %s", cudaGetErrorString(e_)); } while (0)

typedef struct {
    Zero* z;                          // layout and groups (zero_init_layout with use_nccl = 1)
    float *master, *grad, *m, *v;     // device, z->shard_total each
    __nv_bfloat16* master_bf16;       // device, z->shard_total: what the all-gathers send
    __nv_bfloat16* work[2];           // device, z->work_numel each: gathered units
    float* gwork[2];                  // device, z->work_numel each: full gradients of units in backward
    int slot_unit[2];
    cudaStream_t compute;             // the model's stream
    cudaEvent_t gathered[2];          // comm -> compute: slot filled
    cudaEvent_t slot_free[2];         // compute -> comm: slot no longer read
    cudaEvent_t grads_ready[2];       // compute -> comm: gradient slot written
    cudaEvent_t grads_reduced[2];     // comm -> compute: gradient slot reduced, may be reused
    cudaEvent_t bf16_ready;           // compute -> comm: master_bf16 refreshed
    cudaEvent_t shard_done;           // shard stream -> replica stream / compute
} ZeroGpu;

__global__ void zero_f32_to_bf16_kernel(__nv_bfloat16* out, const float* in, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(in[i]);
}
__global__ void zero_accumulate_kernel(float* acc, const float* x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc[i] += x[i];
}
__global__ void zero_scale_kernel(float* x, float s, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}
static inline int zero_grid(size_t n) { size_t b = (n + 255) / 256; return (int)(b < 4096 ? (b ? b : 1) : 4096); }

static inline cudaStream_t zero_gpu_comm_stream(ZeroGpu* zg) { return zg->z->shard.stream; }

// after the optimizer step (on the compute stream): the bf16 copy the gathers send, and the slots are stale
static inline void zero_gpu_refresh_bf16(ZeroGpu* zg) {
    size_t n = zg->z->shard_total;
    zero_f32_to_bf16_kernel<<<zero_grid(n), 256, 0, zg->compute>>>(zg->master_bf16, zg->master, n);
    ZCUDA_CHECK(cudaGetLastError());
    ZCUDA_CHECK(cudaEventRecord(zg->bf16_ready, zg->compute));
    zg->slot_unit[0] = zg->slot_unit[1] = -1;
}

// Copies the host shards of `z` (master, m, v: zero_init's, a checkpoint's or an import's) to the device
// and sets up the slots.
static inline void zero_gpu_init(ZeroGpu* zg, Zero* z, cudaStream_t compute) {
    ENSURE(z->shard.nccl && z->replica.nccl, "zero_gpu_init: the shard group has no NCCL communicator (zero_init_layout use_nccl)");
    zg->z = z;
    zg->compute = compute;
    size_t n = z->shard_total, bytes = n * sizeof(float);
    ZCUDA_CHECK(cudaMalloc((void**)&zg->master, bytes));
    ZCUDA_CHECK(cudaMalloc((void**)&zg->grad, bytes));
    ZCUDA_CHECK(cudaMalloc((void**)&zg->m, bytes));
    ZCUDA_CHECK(cudaMalloc((void**)&zg->v, bytes));
    ZCUDA_CHECK(cudaMalloc((void**)&zg->master_bf16, n * sizeof(__nv_bfloat16)));
    ZCUDA_CHECK(cudaMemcpy(zg->master, z->master, bytes, cudaMemcpyHostToDevice));
    ZCUDA_CHECK(cudaMemcpy(zg->m, z->m, bytes, cudaMemcpyHostToDevice));
    ZCUDA_CHECK(cudaMemcpy(zg->v, z->v, bytes, cudaMemcpyHostToDevice));
    ZCUDA_CHECK(cudaMemset(zg->grad, 0, bytes));
    for (int i = 0; i < 2; i++) {
        ZCUDA_CHECK(cudaMalloc((void**)&zg->work[i], z->work_numel * sizeof(__nv_bfloat16)));
        ZCUDA_CHECK(cudaMalloc((void**)&zg->gwork[i], z->work_numel * sizeof(float)));
        ZCUDA_CHECK(cudaEventCreateWithFlags(&zg->gathered[i], cudaEventDisableTiming));
        ZCUDA_CHECK(cudaEventCreateWithFlags(&zg->slot_free[i], cudaEventDisableTiming));
        ZCUDA_CHECK(cudaEventCreateWithFlags(&zg->grads_ready[i], cudaEventDisableTiming));
        ZCUDA_CHECK(cudaEventCreateWithFlags(&zg->grads_reduced[i], cudaEventDisableTiming));
        // recorded once, so that the first waits on them are satisfied
        ZCUDA_CHECK(cudaEventRecord(zg->slot_free[i], compute));
        ZCUDA_CHECK(cudaEventRecord(zg->grads_reduced[i], compute));
        zg->slot_unit[i] = -1;
    }
    ZCUDA_CHECK(cudaEventCreateWithFlags(&zg->bf16_ready, cudaEventDisableTiming));
    ZCUDA_CHECK(cudaEventCreateWithFlags(&zg->shard_done, cudaEventDisableTiming));
    zero_gpu_refresh_bf16(zg);
}

// issues unit u's all-gather on the communication stream (no-op if its slot holds it)
static inline void zero_gpu_gather_unit_async(ZeroGpu* zg, int u) {
    Zero* z = zg->z;
    int slot = u & 1;
    if (zg->slot_unit[slot] == u) return;
    cudaStream_t comm = zero_gpu_comm_stream(zg);
    ZCUDA_CHECK(cudaStreamWaitEvent(comm, zg->slot_free[slot], 0));   // the compute stream is done reading it
    ZCUDA_CHECK(cudaStreamWaitEvent(comm, zg->bf16_ready, 0));        // the shard is up to date
    comm_all_gather(&z->shard, zg->master_bf16 + z->shard_off[u], zg->work[slot], z->shard_numel[u], COMM_BF16);
    ZCUDA_CHECK(cudaEventRecord(zg->gathered[slot], comm));
    zg->slot_unit[slot] = u;
}
// orders the compute stream after unit u's gather
static inline void zero_gpu_wait_unit(ZeroGpu* zg, int u) { ZCUDA_CHECK(cudaStreamWaitEvent(zg->compute, zg->gathered[u & 1], 0)); }
static inline void zero_gpu_release_unit(ZeroGpu* zg, int u) {
    if (zg->slot_unit[u & 1] != u) return;
    ZCUDA_CHECK(cudaEventRecord(zg->slot_free[u & 1], zg->compute));
    zg->slot_unit[u & 1] = -1;
}

static inline const __nv_bfloat16* zero_gpu_unit_begin(ZeroGpu* zg, int u, int phase) {
    if (phase == UNIT_BACKWARD_GRADS_ONLY) return NULL;
    zero_gpu_gather_unit_async(zg, u);
    zero_gpu_wait_unit(zg, u);
    int next = zero_next_unit(zg->z, u, phase);
    if (next >= 0) zero_gpu_gather_unit_async(zg, next);   // overlaps this unit's compute
    return zg->work[u & 1];
}

// a zeroed gradient buffer for unit u, once the previous reduce-scatter out of its slot has finished
static inline float* zero_gpu_unit_grads(ZeroGpu* zg, int u) {
    int slot = u & 1;
    ZCUDA_CHECK(cudaStreamWaitEvent(zg->compute, zg->grads_reduced[slot], 0));
    ZCUDA_CHECK(cudaMemsetAsync(zg->gwork[slot], 0, (size_t)zg->z->S * zg->z->shard_numel[u] * sizeof(float), zg->compute));
    return zg->gwork[slot];
}

static inline void zero_gpu_unit_end(ZeroGpu* zg, int u, int phase) {
    Zero* z = zg->z;
    if (phase != UNIT_FORWARD) {   // reduce-scatter the unit's gradient on the communication stream
        int slot = u & 1;
        cudaStream_t comm = zero_gpu_comm_stream(zg);
        size_t n = z->shard_numel[u];
        ZCUDA_CHECK(cudaEventRecord(zg->grads_ready[slot], zg->compute));
        ZCUDA_CHECK(cudaStreamWaitEvent(comm, zg->grads_ready[slot], 0));
        comm_reduce_scatter_inplace(&z->shard, zg->gwork[slot], n, COMM_F32);
        zero_accumulate_kernel<<<zero_grid(n), 256, 0, comm>>>(zg->grad + z->shard_off[u], zg->gwork[slot] + (size_t)z->shard.rank * n, n);
        ZCUDA_CHECK(cudaGetLastError());
        ZCUDA_CHECK(cudaEventRecord(zg->grads_reduced[slot], comm));
    }
    if (!(phase == UNIT_FORWARD && u == z->n_units - 1)) zero_gpu_release_unit(zg, u);
}

// after the last micro-batch's backward: all-reduce the gradient shard across the replicas (on the
// replica group's stream, after the shard stream), scale by 1 / W; the compute stream waits for it
static inline void zero_gpu_reduce_grads(ZeroGpu* zg) {
    Zero* z = zg->z;
    cudaStream_t last = zero_gpu_comm_stream(zg);
    if (z->R > 1) {
        ZCUDA_CHECK(cudaEventRecord(zg->shard_done, last));
        ZCUDA_CHECK(cudaStreamWaitEvent(z->replica.stream, zg->shard_done, 0));
        comm_all_reduce(&z->replica, zg->grad, z->shard_total, COMM_F32);
        last = z->replica.stream;
    }
    if (z->W > 1) {
        zero_scale_kernel<<<zero_grid(z->shard_total), 256, 0, last>>>(zg->grad, 1.0f / z->W, z->shard_total);
        ZCUDA_CHECK(cudaGetLastError());
    }
    ZCUDA_CHECK(cudaEventRecord(zg->shard_done, last));
    ZCUDA_CHECK(cudaStreamWaitEvent(zg->compute, zg->shard_done, 0));
}

// the device shards -> the host shards of z (before a checkpoint save or an export, which read z->master,
// z->m, z->v); waits for the compute stream
static inline void zero_gpu_to_host(ZeroGpu* zg) {
    Zero* z = zg->z;
    size_t bytes = z->shard_total * sizeof(float);
    ZCUDA_CHECK(cudaStreamSynchronize(zg->compute));
    ZCUDA_CHECK(cudaMemcpy(z->master, zg->master, bytes, cudaMemcpyDeviceToHost));
    ZCUDA_CHECK(cudaMemcpy(z->m, zg->m, bytes, cudaMemcpyDeviceToHost));
    ZCUDA_CHECK(cudaMemcpy(z->v, zg->v, bytes, cudaMemcpyDeviceToHost));
}

static inline void zero_gpu_free(ZeroGpu* zg) {
    ZCUDA_CHECK(cudaFree(zg->master)); ZCUDA_CHECK(cudaFree(zg->grad));
    ZCUDA_CHECK(cudaFree(zg->m)); ZCUDA_CHECK(cudaFree(zg->v)); ZCUDA_CHECK(cudaFree(zg->master_bf16));
    for (int i = 0; i < 2; i++) {
        ZCUDA_CHECK(cudaFree(zg->work[i])); ZCUDA_CHECK(cudaFree(zg->gwork[i]));
        ZCUDA_CHECK(cudaEventDestroy(zg->gathered[i])); ZCUDA_CHECK(cudaEventDestroy(zg->slot_free[i]));
        ZCUDA_CHECK(cudaEventDestroy(zg->grads_ready[i])); ZCUDA_CHECK(cudaEventDestroy(zg->grads_reduced[i]));
    }
    ZCUDA_CHECK(cudaEventDestroy(zg->bf16_ready));
    ZCUDA_CHECK(cudaEventDestroy(zg->shard_done));
}
