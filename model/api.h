/*
 * api.h — the backend contract: what a backend's MODEL and its parameter STORE answer to the training
 * loop, which is written once for both backends (train<Model, Store> in train_dbrx.cu, with its helpers
 * evaluate, evaluate_mc, generate_tokens, health_check). Two backends implement it:
 *   CPU   Dbrx    (model/dbrx.h, FP32 reference)    with the store Zero    (parallel/zero.h, MPI, host memory)
 *   CUDA  DbrxGPU (model/dbrx_cuda.cuh, BF16/FP8)   with the store ZeroGpu (parallel/zero_gpu.cuh, NCCL, device)
 * The calls are free functions overloaded on the model or store pointer (llm.c style: no virtual calls);
 * DBRX_CHECK_MODEL_CONTRACT(Model) and DBRX_CHECK_STORE_CONTRACT(Store, Model) check at compile time
 * that a backend answers each with the arguments and result below. Each is expanded at the end of the file
 * that completes the backend (model/dbrx.h, model/dbrx_cuda.cuh; parallel/zero.h, parallel/zero_gpu.cuh),
 * so a call missing or of the wrong type stops that file's compilation with the call's name.
 *
 * N = B*T tokens of one micro-batch; V vocabulary; L layers; E experts per layer. Host pointers unless
 * said otherwise.
 *
 * THE MODEL (its struct holds, for the loop: cfg (DbrxConfig), table (the parameter table, ParamInfo),
 * B, T (the micro-batch its activations are sized for), and the results of the last forward pass:
 * ce_loss, lbl_loss, z_loss (double), imbalance (double: max over layers of max / mean tokens per expert))
 *   double dbrx_forward(m, const int* inputs, const int* targets, float dloss)
 *       inputs, targets (B, T) token ids. Returns the mean cross-entropy and sets the results above.
 *       dloss: the loop's 1 / grad_accum in training, 0 for evaluation (no backward follows).
 *   void dbrx_backward(m, const int* inputs, const int* targets, float dloss)
 *       backward of dloss * (ce + lbl + z) of the last forward, the same arguments; ACCUMULATES the
 *       gradients into the model's gradient views, whose memory the store owns.
 *       (Both take both: the CPU reads dloss in the backward (and in the forward only whether it is > 0:
 *       --compress-acts compresses only for a backward), the GPU's fused classifier already in the
 *       forward, which therefore must get the same dloss; the GPU's backward reads the tokens the forward
 *       copied to the device, the CPU's the host arrays. So dbrx_backward(DbrxGPU) ignores inputs and
 *       targets: one signature for the loop.)
 *   std::vector<Fp8MetaRef> dbrx_fp8_metas(m)
 *       every FP8 operand state (name, Fp8Meta, format) in model/fp8.cuh's fixed operand order; empty
 *       without --fp8. The loop max-reduces their amaxes (through the store) and logs them.
 *   float dbrx_fp8_log_scale(m, const Fp8MetaRef& r, int i)
 *       the scale to log for operand i (r = dbrx_fp8_metas(m)[i]): the CPU's r.meta->scale, the GPU's
 *       last quantisation's.
 *   void dbrx_logits_to_host(m, std::vector<float>* out)     out (N * V): the last forward's logits
 *   void dbrx_losses_to_host(m, std::vector<float>* out)     out (N): its per-token cross-entropy
 *   void dbrx_expert_counts_add(m, std::vector<double>* acc) acc (L * E) += its tokens per expert
 *   void dbrx_sync(m)                                         waits for the device (CPU: nothing)
 *   ProfTrack dbrx_prof_track(m)                              where --profile times its ranges (model/profile.h): the
 *       host's clock (CPU), its stream's events (CUDA)
 *   void dbrx_decode_alloc(m, int T_max)                      generation's KV cache for T_max positions
 *   const float* dbrx_decode_step(m, int token, int pos)      one position (V logits on the host, valid until
 *       the next step; the CPU's are `real`). Collective under a sharded store, as the forward.
 *   void dbrx_free(m)
 *   Unit hooks (model/dbrx.h: UnitHooks) and the experts' dispatcher (ExpertHooks): the forward and
 *   backward announce every sharding unit to the store, and hand the routed rows of each MoE layer to a
 *   dispatcher when one is installed (expert parallelism).
 *
 * THE STORE (the fp32 master weights, gradients and AdamW moments, as this rank's shard)
 *   void   zero_init(store, model, Comm*, int S, uint64_t seed, int ep_n)  the groups, the layout, the shard
 *          initialised as the unsharded model would be; points the model's views (or installs its unit
 *          hooks, S > 1, and its experts' dispatcher, ep_n > 1)
 *   void   zero_zero_grad(store)                  the gradient shard to zero, before the micro-batches
 *   void   zero_last_micro(store, bool last)      before a micro-batch: whether it is the step's last (HSDP on the GPU:
 *          each unit's shard part is summed over the replicas right after its last reduce-scatter; the CPU: nothing)
 *   void   zero_reduce_grads(store)               after them: the gradients summed over the replicas
 *   double zero_grad_norm(store)                  the global gradient norm (collective)
 *   void   zero_scale_grads(store, float f)       gradients *= f (the spike injection of the tests)
 *   double zero_update(store, const AdamWConfig*, float lr, int t, double norm)  AdamW step t with
 *          global-norm clipping at norm; closes the FP8 step (the amaxes join the histories)
 *   void   zero_skip_update(store)                a skipped step: no update, this step's FP8 amaxes dropped
 *   void   zero_fp8_amax_reduce(store, std::vector<Fp8MetaRef>& metas, std::vector<float>* amax_local)
 *          the amaxes max-reduced over the world (amax_local: this rank's, for the log; or NULL)
 *   uint64_t zero_bytes_sent(const store*)        bytes this rank sent so far (the log's communication bytes)
 *   Zero*  zero_layout(store)                     the layout and host shards that checkpoints and Hugging
 *          Face interop read (zero_host_state_finite(Zero*) checks them)
 *   void   zero_to_host(store), zero_from_host(store)  the host shards from / to the backend's copy
 *   void   zero_free(store)
 *   and, for the model it serves, expert parallelism's statistics (parallel/expert_parallel*.h):
 *   int  dbrx_ep_recv_rows(const m*)              the most rows this rank's experts took in one layer, last forward
 *   void dbrx_ep_totals(const m*, long long* out, long long* in, long long* counts)  rows sent, received,
 *        count messages over every forward (the EP test's byte formula)
 */
#pragma once
#include <stdint.h>
#include <type_traits>
#include <utility>
#include <vector>

// (a call's result type, of these arguments)
#define DBRX_API_RESULT(call) decltype(call)
#define DBRX_API_IS(call, R) static_assert(std::is_same<DBRX_API_RESULT(call), R>::value, #call " must return " #R)

#define DBRX_CHECK_MODEL_CONTRACT(Model)                                                                                        \
    static_assert(std::is_same<decltype(std::declval<Model&>().cfg), DbrxConfig>::value, #Model ": cfg");                        \
    static_assert(std::is_same<decltype(std::declval<Model&>().table), std::vector<ParamInfo>>::value, #Model ": table");        \
    static_assert(std::is_same<decltype(std::declval<Model&>().B), int>::value && std::is_same<decltype(std::declval<Model&>().T), int>::value, \
                  #Model ": B, T");                                                                                                \
    static_assert(std::is_same<decltype(std::declval<Model&>().ce_loss), double>::value &&                                        \
                  std::is_same<decltype(std::declval<Model&>().lbl_loss), double>::value &&                                       \
                  std::is_same<decltype(std::declval<Model&>().z_loss), double>::value &&                                         \
                  std::is_same<decltype(std::declval<Model&>().imbalance), double>::value, #Model ": the last forward's results"); \
    DBRX_API_IS(dbrx_forward(std::declval<Model*>(), std::declval<const int*>(), std::declval<const int*>(), 0.0f), double);      \
    DBRX_API_IS(dbrx_backward(std::declval<Model*>(), std::declval<const int*>(), std::declval<const int*>(), 0.0f), void);       \
    DBRX_API_IS(dbrx_fp8_metas(std::declval<Model*>()), std::vector<Fp8MetaRef>);                                                 \
    DBRX_API_IS(dbrx_fp8_log_scale(std::declval<Model*>(), std::declval<const Fp8MetaRef&>(), 0), float);                        \
    DBRX_API_IS(dbrx_logits_to_host(std::declval<Model*>(), std::declval<std::vector<float>*>()), void);                          \
    DBRX_API_IS(dbrx_losses_to_host(std::declval<Model*>(), std::declval<std::vector<float>*>()), void);                          \
    DBRX_API_IS(dbrx_expert_counts_add(std::declval<Model*>(), std::declval<std::vector<double>*>()), void);                      \
    DBRX_API_IS(dbrx_sync(std::declval<Model*>()), void);                                                                         \
    DBRX_API_IS(dbrx_prof_track(std::declval<Model*>()), ProfTrack);                                                              \
    DBRX_API_IS(dbrx_decode_alloc(std::declval<Model*>(), 0), void);                                                              \
    static_assert(std::is_pointer<decltype(dbrx_decode_step(std::declval<Model*>(), 0, 0))>::value &&                            \
                  std::is_floating_point<std::remove_const_t<std::remove_pointer_t<decltype(dbrx_decode_step(std::declval<Model*>(), 0, 0))>>>::value, \
                  #Model ": dbrx_decode_step must return the logits (const floating point *)");                                  \
    DBRX_API_IS(dbrx_free(std::declval<Model*>()), void)

#define DBRX_CHECK_STORE_CONTRACT(Store, Model)                                                                                   \
    DBRX_API_IS(zero_init(std::declval<Store*>(), std::declval<Model*>(), std::declval<Comm*>(), 1, (uint64_t)0, 1), void);      \
    DBRX_API_IS(zero_zero_grad(std::declval<Store*>()), void);                                                                    \
    DBRX_API_IS(zero_last_micro(std::declval<Store*>(), true), void);                                                            \
    DBRX_API_IS(zero_reduce_grads(std::declval<Store*>()), void);                                                                 \
    DBRX_API_IS(zero_grad_norm(std::declval<Store*>()), double);                                                                  \
    DBRX_API_IS(zero_scale_grads(std::declval<Store*>(), 1.0f), void);                                                            \
    DBRX_API_IS(zero_update(std::declval<Store*>(), std::declval<const AdamWConfig*>(), 0.0f, 1, 0.0), double);                   \
    DBRX_API_IS(zero_skip_update(std::declval<Store*>()), void);                                                                  \
    DBRX_API_IS(zero_fp8_amax_reduce(std::declval<Store*>(), std::declval<std::vector<Fp8MetaRef>&>(), std::declval<std::vector<float>*>()), void); \
    DBRX_API_IS(zero_bytes_sent(std::declval<const Store*>()), uint64_t);                                                         \
    DBRX_API_IS(zero_layout(std::declval<Store*>()), Zero*);                                                                      \
    DBRX_API_IS(zero_host_state_finite(std::declval<Zero*>()), bool);                                                             \
    DBRX_API_IS(zero_to_host(std::declval<Store*>()), void);                                                                      \
    DBRX_API_IS(zero_from_host(std::declval<Store*>()), void);                                                                    \
    DBRX_API_IS(zero_free(std::declval<Store*>()), void);                                                                         \
    DBRX_API_IS(dbrx_ep_recv_rows(std::declval<const Model*>()), int);                                                            \
    DBRX_API_IS(dbrx_ep_totals(std::declval<const Model*>(), std::declval<long long*>(), std::declval<long long*>(), std::declval<long long*>()), void)
