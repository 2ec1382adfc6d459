/*
 * test_memory_plan.cpp — the planner behind --dry-run (parallel/memory_plan.h), on the emulated CUDA
 * backend (g++ -DSIMT_EMULATION; make test). Checks:
 *   - every term of a small model against values computed by hand from the shapes (below, in the comments);
 *   - the activation and routing-index classes sum to the model's own buffer walk (dbrx_gpu_memory_estimate,
 *     what dbrx_build_shape allocates), with FP8 off, delayed and block, at several micro-batches, without EP and with EP 2
 *     (FP8's weight scratch for a rank's own experts);
 *   - the parameter state and working set equal the store's (zero_gpu_estimate_bytes) for S 1, 2, 4 and EP 1, 2 (and with
 *     --adam-moments bf16: 4 bytes a shard element less, by hand);
 *   - the emulator's peak device memory over one training step of a one-GPU model (dbrx_build: the whole
 *     model's state, which is the store's at S = 1) is the planner's allocations within 2%, and its
 *     negative control: a plan for the wrong micro-batch is not;
 *   - --recompute: the plan's decrease is the model's walk's, to the byte, and the emulator's peak with it
 *     is the plan's within 2% and below the peak without it (five specs); the CPU model's dry-run estimate
 *     with it (train_dbrx.cu's activation_bytes) is its walk, to the byte;
 *   - the vocabulary slot (--zero-chunk-mib, parallel/zero_gpu_vocab.cuh): the layout's vocabulary runs (rows, norm_f in
 *     the head's chunk 0, every chunk within the ring), and DBRX-132B's working set at S 64 to the byte against its
 *     formula, without EP (3.36 GiB) and with EP 8, the ring the same at 4x the vocabulary;
 *   - --context-parallel (memory_plan_cp): the GPU ring's two K|V slots, its dK|dV slots, the chunk pairs' scratch (against
 *     model/attention_cp_cuda.cuh's count) by hand at CP 2, 4, 8 (the emulator's peak per rank against the --dry-run plan
 *     within 0.1%: test/test_cp.sh);
 *   - DBRX-132B on 64 GPUs, shard group 64, EP 8: the parameter state is 18 B x the shard test_ep.sh ties to
 *     the allocation, and the NCCL margin is five communicators (the reduce-scatters' two among them) and seven
 *     all-to-all peers;
 *   - --zero-embedding rows at DBRX-132B, S 8 and 64: its buffers in the allocations (none without the vocabulary slot
 *     or with one rank a shard group) and its communicator's NCCL margin at 2 of 32 channels, by hand.
 */
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest.h>
#include <vector>
#include "../model/dbrx_cuda.cuh"
#include "../parallel/zero_gpu.cuh"
#include "../parallel/memory_plan.h"
#include "cuda_test_helpers.h"

// d 64, 4 heads (kv 2, head_dim 16: qkv width 128), 2 layers, 4 experts top-2 (F 96), vocab 256
static DbrxConfig small() {
    DbrxConfig c;
    REQUIRE(model_preset_lookup("dbrx-tiny", &c));
    c.d_model = 64; c.n_heads = 4; c.kv_heads = 2; c.head_dim = 16; c.n_layers = 2;
    c.n_experts = 4; c.top_k = 2; c.ffn_hidden = 96; c.vocab_size = 256; c.max_seq_len = 64;
    return c;
}

TEST_CASE("the plan's terms of a small model, by hand (B 2 x T 16: N = 32 tokens, R = 64 routed rows)") {
    DbrxConfig c = small();
    // P = L (d qd + d d + 2 d + d E + 3 E F d) + 2 V d + d = 2 (8192 + 4096 + 128 + 256 + 73728) + 32768 + 64 = 205632
    REQUIRE(params_total(&c) == 205632);
    MemoryPlan p = memory_plan(&c, 2, 16, 1, 1, 1, FP8_OFF);
    CHECK(p.shard_params == 205632);
    CHECK(p.master == 822528); CHECK(p.grads == 822528); CHECK(p.adam_m == 822528); CHECK(p.adam_v == 822528);
    CHECK(p.bf16_copy == 411264);
    CHECK(p.norm_scratch == 256 * 4 + 8);
    CHECK(p.gathered_slots == 0); CHECK(p.grad_slots == 0);
    // attention: ln1 2*32*64 + stats 2*4*32 + qkv_pre, qkv 2*2*32*128 + lse 4*2*4*16 + atty 2*32*64 = 25344
    CHECK(p.layer_attention == 25344);
    // resid_mid 4096 + ln2 4096 + stats 256 + the block's input 4096
    CHECK(p.layer_norms == 12544);
    // logits, probs 2*4*32*4 + lse 4*32 + top-k weights 4*32*2 + statistics 4*5
    CHECK(p.layer_router == 1428);
    // xe 2*64*64 + g, u, act 3*2*64*96 + ye 2*64*64
    CHECK(p.layer_experts == 53248);
    // topk_idx 4*32*2 + counts 16 + offsets 20 + row_token, slot_row 2*4*64
    CHECK(p.layer_routing == 804);
    CHECK(p.saved == 2 * (25344 + 12544 + 1428 + 53248));
    CHECK(p.routing_index == 2 * 804);
    // loss 8 + final residual, lnf 2*2*32*64 + stats 256 + logits 2*32*256 + losses 128 + RoPE 2*4*16*8 + ids and the
    // embedding plan 4*161 + the documents' starts and ends (--doc-mask) 4*64
    CHECK(p.head == 8 + 8192 + 256 + 16384 + 128 + 1024 + 644 + 256);
    // attproj 4096, dresid, dln 2*4*32*64, dresid_bf16, datty 2*2*32*64, dqkv 2*32*128, drouter 2*32*4, dtopk_w 4*32*2,
    // dxe 2*64*64, att_D 512, LayerNorm partials 4*1*64, grad-norm partials 4*258, dye 8192, da, dg, du 3*2*64*96
    CHECK(p.scratch == 4096 + 16384 + 8192 + 8192 + 256 + 256 + 8192 + 512 + 256 + 1032 + 8192 + 36864);
    CHECK(p.fp8_scratch == 0); CHECK(p.ep_exchange == 0);
    CHECK(p.communicators == 0); CHECK(p.nccl == 0);
    CHECK(p.total == p.allocations + 2 * 32 * PLAN_MIB + 600 * PLAN_MIB);   // (two cuBLASLt workspaces: --moe-streams 2)
    // FP8 (F 96, a multiple of 16): the routed rows padded by 15 E = 60 to 124, and no act (gpu_act_kept: the
    // fused FP8 experts never read it): xe 2*124*64 + g, u 2*2*124*96 + ye 2*124*64; --recompute swiglu drops g, u
    for (Fp8Recipe r : {FP8_DELAYED, FP8_BLOCK}) {
        MemoryPlan f = memory_plan(&c, 2, 16, 1, 1, 1, r);
        CHECK(f.layer_experts == 2 * 124 * 64 + 2 * 2 * 124 * 96 + 2 * 124 * 64);
        CHECK(f.rc_bit_bytes[1] == 2 * 2 * 124 * 96);
    }

    // 4 GPUs, shard group 2, EP 2: every tensor halves; a rank gathers only its 2 experts, 2 x 3 F d = 36864
    // parameters, the biggest unit (the embedding 16384, the head 16448, a block's attention 12672)
    MemoryPlan q = memory_plan(&c, 2, 16, 2, 2, 4, FP8_OFF);
    CHECK(q.shard_params == 102816);
    CHECK(q.slot_params == 36864);
    CHECK(q.gathered_slots == 2 * 2 * 36864); CHECK(q.grad_slots == 2 * 4 * 36864);
    // EP 2, --ep-capacity-factor 2 (the default): 2 x N k = 128 rows planned per layer (= the dropless bound,
    // n N min(k, E/n) = 2 x 32 x 2); per layer xl 2*128*64 + perm, inv 2*4*128; shared x, y, dx, dxr 4*2*128*64.
    // The model's own g, u, act (per layer) and da, dg, du (scratch) hold the planned rows: 3*2*128*96 each; its
    // routed rows xe (2*64*64) are one buffer the layers share (the backward reads xl), ye is per layer
    CHECK(q.ep_rows == 128);
    CHECK(q.ep_exchange == 2 * (16384 + 1024) + 65536);
    CHECK(q.layer_experts == 3 * 2 * 128 * 96 + 2 * 64 * 64);
    CHECK(q.saved == 2 * (q.layer_attention + q.layer_norms + q.layer_router + q.layer_experts) + 2 * 64 * 64);
    MemoryPlan q15 = memory_plan(&c, 2, 16, 2, 2, 4, FP8_OFF, 1.5);   // 1.5 x 64 = 96 rows
    CHECK(q15.ep_rows == 96);
    CHECK(q15.ep_exchange == 2 * (2 * 96 * 64 + 8 * 96) + 4 * 2 * 96 * 64);
    // communicators: shard 2, replica 2, expert_parallel 2, shard_rs 2 (the reduce-scatters', zero_gpu_comm.cuh;
    // expert_shard and expert_shard_rs: P/n = 1 rank); one all-to-all peer
    CHECK(q.communicators == 4); CHECK(q.a2a_peers == 1);
    CHECK(q.nccl == 4 * 512 * PLAN_MIB + 448 * PLAN_MIB);
}

TEST_CASE("the activation classes sum to the model's own buffer walk (dbrx_gpu_memory_estimate)") {
    DbrxConfig c = small();
    for (Fp8Recipe r : {FP8_OFF, FP8_DELAYED, FP8_BLOCK})
        for (int BT : {16, 48, 64}) {
            Fp8Config f8 = {r, 16, 0, 0};
            int B = BT == 48 ? 3 : 1, T = BT / B;
            // S = 1: the FP8 weights stay in place and are cached (fp8_weight_gpu); S = 2: gathered, not cached. EP 2:
            // the experts' buffers for the planned received rows, FP8's weight scratch for a rank's 2 experts
            // (EP 2 with 2 exchange chunks: under block scaling with gathered weights a third weight scratch, ep_fp8_hold)
            for (int S : {1, 2})
                for (int n : {1, 2})
                    for (int chunks : {1, 2}) {
                        MemoryPlan p = memory_plan(&c, B, T, S, n, 2, r, EP_CAPACITY_DEFAULT, 0, false, chunks);
                        size_t rows = n > 1 ? (size_t)p.ep_rows : 0;
                        bool hold = ep_fp8_hold(n, chunks, r, S == 1);
                        long double walk = (long double)dbrx_gpu_memory_estimate(&c, B, T, nullptr, &f8, false, rows, S == 1, n, hold);
                        CAPTURE((int)r); CAPTURE(B); CAPTURE(T); CAPTURE(S); CAPTURE(n); CAPTURE(chunks);
                        CHECK(p.saved + p.head + p.scratch + p.fp8_scratch + p.routing_index == walk);
                        if (hold) CHECK(p.fp8_scratch > memory_plan(&c, B, T, S, n, 2, r).fp8_scratch);   // (w3 counted)
                    }
        }
}

TEST_CASE("the parameter state and working set are the store's (zero_gpu_estimate_bytes)") {
    DbrxConfig c = small();
    for (int S : {1, 2, 4})
        for (int n : {1, 2}) {
            MemoryPlan p = memory_plan(&c, 2, 16, S, n, 4, FP8_OFF);
            CAPTURE(S); CAPTURE(n);
            CHECK(plan_param_state(&p) + p.gathered_slots + p.grad_slots == (long double)zero_gpu_estimate_bytes(&c, S, n));
        }
    // --grad-reduce-dtype bf16: the scratch of the longest run (S > 1 only), in the store's bytes as in the plan's
    for (int S : {1, 2, 4})
        for (int n : {1, 2}) {
            MemoryPlan p = memory_plan(&c, 2, 16, S, n, 4, FP8_OFF, EP_CAPACITY_DEFAULT, 0, true);
            CAPTURE(S); CAPTURE(n);
            CHECK(plan_param_state(&p) + p.gathered_slots + p.grad_slots == (long double)zero_gpu_estimate_bytes(&c, S, n, 0, 1));
            CHECK(p.rs_scratch == (long double)(zero_gpu_estimate_bytes(&c, S, n, 0, 1) - zero_gpu_estimate_bytes(&c, S, n)));
            CHECK((p.rs_scratch > 0) == (S > 1));
        }
    // the optimizer's state against AdamW's FP32 m and v (by hand), in the store's bytes as in the plan's:
    // --adam-moments bf16 (m, v 2 bytes a shard element each), --optimizer lion (m alone, 4 bytes; with bf16 2, no v)
    struct { int bf16, lion; long double m, v; } opts[] = {{1, 0, 2, 2}, {0, 1, 4, 0}, {1, 1, 2, 0}};
    for (int S : {1, 2, 4})
        for (const auto& o : opts) {
            MemoryPlan p32 = memory_plan(&c, 2, 16, S, 1, 4, FP8_OFF);
            long double store32 = (long double)zero_gpu_estimate_bytes(&c, S, 1);
            g_adam_moments_bf16 = o.bf16;
            g_optimizer_lion = o.lion;
            MemoryPlan po = memory_plan(&c, 2, 16, S, 1, 4, FP8_OFF);
            long double store = (long double)zero_gpu_estimate_bytes(&c, S, 1);
            g_adam_moments_bf16 = g_optimizer_lion = 0;
            CAPTURE(S); CAPTURE(o.bf16); CAPTURE(o.lion);
            CHECK(po.adam_m == o.m * po.shard_params);
            CHECK(po.adam_v == o.v * po.shard_params);
            CHECK(plan_param_state(&p32) - plan_param_state(&po) == (8 - o.m - o.v) * po.shard_params);
            CHECK(plan_param_state(&po) + po.gathered_slots + po.grad_slots == store);
            CHECK(store32 - store == (8 - o.m - o.v) * po.shard_params);
        }
    c.n_layers = 7;   // extrapolated in the layers from 1, 2, 3 (the store's layout is affine in them)
    MemoryPlan p = memory_plan(&c, 2, 16, 4, 2, 4, FP8_OFF);
    CHECK(plan_param_state(&p) + p.gathered_slots + p.grad_slots == (long double)zero_gpu_estimate_bytes(&c, 4, 2));
    MemoryPlan pb = memory_plan(&c, 2, 16, 4, 2, 4, FP8_OFF, EP_CAPACITY_DEFAULT, 0, true);
    CHECK(plan_param_state(&pb) + pb.gathered_slots + pb.grad_slots == (long double)zero_gpu_estimate_bytes(&c, 4, 2, 0, 1));
    CHECK(pb.rs_scratch > 0);
    // --zero-chunk-mib: the experts in chunks (S > 1); a budget of a tenth of the experts unit
    double mib = 0.1 * 2.0 * 3 * c.n_experts * c.ffn_hidden * c.d_model / 1048576;
    for (int S : {2, 4}) {
        MemoryPlan q = memory_plan(&c, 2, 16, S, 1, 4, FP8_OFF, EP_CAPACITY_DEFAULT, mib);
        int Ec = zero_chunk_experts(&c, S, 1, false, mib), Vc = zero_vocab_rows(&c, S, 1, false, mib);
        CAPTURE(S); CAPTURE(Ec); CAPTURE(Vc);
        CHECK((Ec >= 1 && Ec < c.n_experts && q.chunk_experts == Ec));
        CHECK((Vc > 0 && Vc < c.vocab_size && q.vocab_rows == Vc));   // (the vocabulary's gradients in chunks too)
        CHECK(plan_param_state(&q) + q.gathered_slots + q.grad_slots == (long double)zero_gpu_estimate_bytes(&c, S, 1, Ec, 0, Vc));
        CHECK(q.gathered_slots < memory_plan(&c, 2, 16, S, 1, 4, FP8_OFF).gathered_slots);
    }
    // --recompute moe/block under S > 1: the recompute slot, one block unit's BF16 slot (zero_gpu_rc_prefetch), in the
    // store's bytes as in the plan's; none at S = 1 or without a recomputed block
    for (const char* spec : {"moe", "block", "moe:0-1", "swiglu"})
        for (int S : {1, 2, 4})
            for (int n : {1, 2}) {
                g_recompute = recompute_parse(spec);
                MemoryPlan r = memory_plan(&c, 2, 16, S, n, 4, FP8_OFF);
                Zero z;
                zero_unit_layout(&z, &c, dbrx_param_table(&c), S, n, 0, 0);
                CAPTURE(spec); CAPTURE(S); CAPTURE(n);
                CHECK(plan_param_state(&r) + r.gathered_slots + r.grad_slots == (long double)zero_gpu_estimate_bytes(&c, S, n));
                CHECK(r.rc_slot == (S > 1 && strcmp(spec, "swiglu") ? 2.0L * z.slot_numel[1] : 0.0L));
                CHECK(zero_rc_slot_numel(&z) * 2 == (size_t)r.rc_slot);
            }
    g_recompute = recompute_parse("moe");   // (the experts in chunks: the slot too, gathered by their first chunk)
    MemoryPlan rq = memory_plan(&c, 2, 16, 2, 1, 4, FP8_OFF, EP_CAPACITY_DEFAULT, mib);
    CHECK(rq.chunk_experts > 0);
    Zero zq;
    zero_unit_layout(&zq, &c, dbrx_param_table(&c), 2, 1, rq.chunk_experts, rq.vocab_rows);
    CHECK((rq.rc_slot > 0 && rq.rc_slot == 2.0L * zq.slot_numel[1]));
    CHECK(zero_rc_slot_numel(&zq) * 2 == (size_t)rq.rc_slot);
    CHECK(plan_param_state(&rq) + rq.gathered_slots + rq.grad_slots
          == (long double)zero_gpu_estimate_bytes(&c, 2, 1, rq.chunk_experts, 0, rq.vocab_rows));
    g_recompute = recompute_parse("");
    // ... and under EP 2 a rank's E/2 experts in chunks (a divisor of E/2), packed and spread alike
    for (int S : {2, 4}) {
        MemoryPlan q = memory_plan(&c, 2, 16, S, 2, 4, FP8_OFF, EP_CAPACITY_DEFAULT, mib / 2);
        int Ec = zero_chunk_experts(&c, S, 2, false, mib / 2), Vc = zero_vocab_rows(&c, S, 2, false, mib / 2);
        CAPTURE(S); CAPTURE(Ec);
        CHECK((Ec >= 1 && Ec < c.n_experts / 2 && (c.n_experts / 2) % Ec == 0 && q.chunk_experts == Ec));
        CHECK(plan_param_state(&q) + q.gathered_slots + q.grad_slots == (long double)zero_gpu_estimate_bytes(&c, S, 2, Ec, 0, Vc));
        CHECK(q.slot_params < memory_plan(&c, 2, 16, S, 2, 4, FP8_OFF).slot_params);
    }
}

// one forward and backward of the emulated model (B x T tokens): the peak of its device memory above what was
// allocated before (AdamW allocates nothing)
static double step_peak(const DbrxConfig& c, int B, int T) {
    std::vector<int> in(B * T), tg(B * T);
    Rng r = {7};
    for (int i = 0; i < B * T; i++) { in[i] = (int)(rng_u64(&r) % 256); tg[i] = (int)(rng_u64(&r) % 256); }
    simt::peak_device_bytes_reset();
    size_t base = simt::peak_device_bytes();
    DbrxGPU g;
    dbrx_build(&g, &c, B, T, 1337);
    dbrx_zero_grad(&g);
    dbrx_forward(&g, in.data(), tg.data(), 1.0f);
    dbrx_backward(&g, in.data(), tg.data(), 1.0f);
    double peak = (double)(simt::peak_device_bytes() - base);
    dbrx_free(&g);
    return peak;
}

TEST_CASE("the emulator's peak device memory over one step is the plan's allocations within 2%") {
    DbrxConfig c = small();
    const int B = 2, T = 32;
    double peak = step_peak(c, B, T);
    double plan = (double)memory_plan(&c, B, T, 1, 1, 1, FP8_OFF).allocations;
    double wrong = (double)memory_plan(&c, B, T / 2, 1, 1, 1, FP8_OFF).allocations;   // negative control
    MESSAGE("emulated peak " << (long long)peak << " bytes, plan " << (long long)plan << " (" << 100 * (peak / plan - 1) << "%)");
    CHECK(peak > 0);
    CHECK(std::fabs(peak / plan - 1) <= 0.02);
    CHECK(std::fabs(peak / wrong - 1) > 0.02);
}

TEST_CASE("--recompute: the plan drops what the model does not allocate, and the emulator's peak follows it") {
    DbrxConfig c = small();
    c.n_layers = 3;
    const int B = 2, T = 32;
    g_recompute = recompute_parse("");
    MemoryPlan off = memory_plan(&c, B, T, 1, 1, 1, FP8_OFF);
    size_t walk_off = dbrx_gpu_memory_estimate(&c, B, T, nullptr, nullptr, false);
    double peak_off = step_peak(c, B, T);
    for (const char* spec : {"attn", "swiglu:first2", "moe:1-2", "block", "attn,block:every2"}) {
        g_recompute = recompute_parse(spec);
        MemoryPlan on = memory_plan(&c, B, T, 1, 1, 1, FP8_OFF);
        size_t walk_on = dbrx_gpu_memory_estimate(&c, B, T, nullptr, nullptr, false);
        // the plan's decrease is the model's own walk's, to the byte, and it is dropped - shared scratch
        CHECK((long double)walk_off - (long double)walk_on == off.allocations - on.allocations);
        CHECK(off.allocations - on.allocations == on.recompute_dropped - on.recompute_scratch);
        CHECK(on.recompute_dropped > on.recompute_scratch);
        double peak = step_peak(c, B, T);
        MESSAGE(spec << ": emulated peak " << (long long)peak << " (without " << (long long)peak_off << "), plan " << (long long)on.allocations);
        CHECK(std::fabs(peak / (double)on.allocations - 1) <= 0.02);
        CHECK(peak < peak_off);
    }
    g_recompute = recompute_parse("block");
    CHECK(memory_plan(&c, B, T, 1, 1, 1, FP8_OFF).recompute_dropped == 3 * (off.rc_bit_bytes[0] + off.rc_bit_bytes[1] + off.rc_bit_bytes[2] +
                                                                           off.rc_bit_bytes[3]));
    g_recompute = recompute_parse("");
}

TEST_CASE("--compress-acts: the plan keeps the codes of the layers it names, as the model allocates them, and the peak follows") {
    DbrxConfig c = small();
    c.n_layers = 3;
    const int B = 2, T = 32;
    g_recompute = g_compress = recompute_parse("");
    MemoryPlan off = memory_plan(&c, B, T, 1, 1, 1, FP8_OFF);
    size_t walk_off = dbrx_gpu_memory_estimate(&c, B, T, nullptr, nullptr, false);
    double peak_off = step_peak(c, B, T);
    struct Case { const char *rc, *ca; };
    for (Case k : {Case{"", "swiglu"}, Case{"attn,swiglu:0", "swiglu:first2"}, Case{"block:1", "swiglu:every2"}, Case{"", "attn"},
                   Case{"block:0,moe:2", "attn,swiglu:1-2"}}) {
        g_recompute = recompute_parse(k.rc);
        g_compress = recompute_parse(k.ca, "--compress-acts", RC_COMPRESS_GRANS);
        MemoryPlan on = memory_plan(&c, B, T, 1, 1, 1, FP8_OFF);
        size_t walk_on = dbrx_gpu_memory_estimate(&c, B, T, nullptr, nullptr, false);
        CHECK((long double)walk_off - (long double)walk_on == off.allocations - on.allocations);
        CHECK(on.compressed_kept > 0);
        CHECK(off.allocations - on.allocations == on.recompute_dropped - on.recompute_scratch - on.compressed_kept);
        double peak = step_peak(c, B, T);
        MESSAGE(std::string(k.rc) << " + " << std::string(k.ca) << ": emulated peak " << (long long)peak << " (without " << (long long)peak_off << "), plan "
                      << (long long)on.allocations);
        CHECK(std::fabs(peak / (double)on.allocations - 1) <= 0.02);
        CHECK(peak < peak_off);
    }
    // the compressed layers: 2 F bytes of codes and 8 F / 128 of factors per row, against 6 F of BF16 g, u, act
    g_recompute = recompute_parse("");
    g_compress = recompute_parse("swiglu", "--compress-acts", RC_SWIGLU);
    MemoryPlan all = memory_plan(&c, B, T, 1, 1, 1, FP8_OFF);
    long double R = (long double)B * T * c.top_k, F = c.ffn_hidden;
    CHECK(all.compressed_kept == 3 * (2 * R * F + 2 * R * std::ceil(F / 128) * 4));
    CHECK(all.recompute_dropped == 3 * off.rc_bit_bytes[1]);
    // attn: ln1's d bytes of codes and 4 d / 128 of factors per token, against 2 d of BF16; block:1 keeps none
    g_recompute = recompute_parse("block:1");
    g_compress = recompute_parse("attn", "--compress-acts", RC_COMPRESS_GRANS);
    MemoryPlan at = memory_plan(&c, B, T, 1, 1, 1, FP8_OFF);
    long double N = (long double)B * T, d = c.d_model;
    CHECK(at.compressed_kept == 2 * (N * d + N * std::ceil(d / 128) * 4));
    CHECK(at.recompute_dropped == off.rc_bit_bytes[0] + off.rc_bit_bytes[1] + off.rc_bit_bytes[2] + off.rc_bit_bytes[3] + 2 * 2 * N * d);
    g_recompute = recompute_parse("");
    g_compress = recompute_parse("", "--compress-acts", RC_COMPRESS_GRANS);
}

TEST_CASE("--recompute on the CPU model: the dry run's estimate (the walk without it, less what it saves) is the walk") {
    DbrxConfig c = small();
    c.n_layers = 5;
    for (const char* spec : {"attn,block:1-2,swiglu:every4", "moe:first3", "block", "swiglu:4"}) {
        g_recompute = recompute_parse("");
        size_t without = dbrx_activations(NULL, &c, 2, 32);
        g_recompute = recompute_parse(spec);
        size_t with = dbrx_activations(NULL, &c, 2, 32);
        CHECK((long double)with == (long double)without - dbrx_recompute_saved_bytes(&c, 2, 32));
        CHECK(with <= without);
    }
    // with --compress-acts (both formats): the walk without either, less what both save
    for (int fmt : {0, 1})
        for (const char* ca : {"swiglu", "swiglu:1-3,swiglu:every4", "attn", "attn:0-2,swiglu:3"}) {
            g_recompute = g_compress = recompute_parse("");
            g_compress_format = fmt;
            size_t without = dbrx_activations(NULL, &c, 2, 32);
            g_recompute = recompute_parse("attn,swiglu:2");
            g_compress = recompute_parse(ca, "--compress-acts", RC_COMPRESS_GRANS);
            size_t with = dbrx_activations(NULL, &c, 2, 32);
            CHECK((long double)with == (long double)without - dbrx_recompute_saved_bytes(&c, 2, 32));
            CHECK(with < without);
        }
    g_recompute = g_compress = recompute_parse("");
    g_compress_format = 0;
}

TEST_CASE("DBRX-132B on 64 GPUs, shard group 64, EP 8: the parameter state and the NCCL margin") {
    DbrxConfig c;
    REQUIRE(model_preset_lookup("dbrx-132b", &c));
    MemoryPlan p = memory_plan(&c, 1, 4096, 64, 8, 64, FP8_OFF);
    // 2,056,195,680 parameters per GPU (what test_ep.sh ties --dry-run's shard to), 18 B each + the norm scratch
    CHECK(p.shard_params == 2056195680.0L);
    CHECK(plan_param_state(&p) == 18 * 2056195680.0L + 1032);
    // shard 64, expert_parallel 8, expert_shard 8, and the reduce-scatters' shard_rs 64 and expert_shard_rs 8
    // (no replica: 64 / 64)
    CHECK(p.communicators == 5);
    CHECK(p.a2a_peers == 7);
    CHECK(p.total == p.allocations + p.cublaslt + p.cuda_context + 5 * 512 * PLAN_MIB + 7 * 448 * PLAN_MIB);
}

TEST_CASE("--context-parallel: the GPU ring's terms by hand, two K|V slots whatever N (memory_plan_cp)") {
    DbrxConfig c = small();   // kv 2, hd 16, 4 heads, 2 layers, 4 experts, the load-balancing loss on (0.05)
    // this rank's B 2 x Tl 16 tokens: K|V (B, Tl, 2 kv hd) = 2048 elements
    for (int n : {2, 4, 8}) {
        MemoryPlan p = memory_plan(&c, 2, 16, 1, 1, n, FP8_OFF), q = p;
        memory_plan_cp(&q, &c, n);
        CHECK(q.cp == n);
        CHECK(q.cp_kv == 2 * 2 * 2048);                         // two BF16 slots, not N
        CHECK(q.cp_dkv == (n > 2 ? 4 : 3) * 4 * 2048);          // own, two on the ring, (N > 2) the pair at hand's
        // a pair's BF16 out, FP32 merged out and dQ (128 rows x hd 16), lse and D (128 x 2 x 4), 2 x 4 x 1 semaphores + a ticket
        CHECK(q.cp_scratch == 128 * 16 * (2 + 8) + 128 * 8 + 4 * 9);
        CHECK(q.cp_scratch == (long double)cp_attn_scratch_bytes(2, 16, 4, 16));   // (the CUDA side's own count)
        CHECK(q.cp_counts == 4 * 2 * 4);
        CHECK(q.allocations == p.allocations + q.cp_kv + q.cp_dkv + q.cp_scratch + q.cp_counts);
        CHECK(q.communicators == p.communicators + 1);             // "context"
        CHECK(q.total == q.allocations + q.cublaslt + q.cuda_context + q.nccl);
        CHECK(q.nccl == p.nccl + 512 * PLAN_MIB);
    }
    MemoryPlan one = memory_plan(&c, 2, 16, 1, 1, 1, FP8_OFF), same = one;
    memory_plan_cp(&same, &c, 1);   // (no CP: nothing added)
    CHECK(same.allocations == one.allocations); CHECK(same.cp == 1); CHECK(same.communicators == one.communicators);
    // DBRX-132B at seq 32768, CP 8 (4096 tokens per rank): the ring's slots 32 + 128 MiB, the scratch 241.5 MiB
    DbrxConfig d;
    REQUIRE(model_preset_lookup("dbrx-132b", &d));
    MemoryPlan big = memory_plan(&d, 1, 4096, 64, 8, 64, FP8_OFF);
    memory_plan_cp(&big, &d, 8);
    CHECK(big.cp_kv == 32 * PLAN_MIB);
    CHECK(big.cp_dkv == 128 * PLAN_MIB);
    CHECK(big.cp_scratch == (long double)cp_attn_scratch_bytes(1, 4096, 48, 128));
}

TEST_CASE("the vocabulary slot: chunked vocabulary gradients, the parameters whole (--zero-chunk-mib)") {
    DbrxConfig c = small();   // V 256, d 64
    double mib = 0.02;        // 163 rows of BF16 -> 160 a chunk, within the ring (one expert, 3 F d = 18432: 286 rows)
    int Vc = zero_vocab_rows(&c, 2, 1, false, mib);
    CHECK(Vc == 160);
    CHECK(zero_vocab_rows(&c, 1, 1, false, mib) == 0);   // (S = 1: nothing gathered)
    CHECK(zero_vocab_rows(&c, 2, 1, false, 0) == 0);     // (0: the units whole)
    CHECK(zero_vocab_rows(&c, 2, 1, false, 1) == 0);     // (a budget above the vocabulary: one chunk, i.e. none)
    Zero z;
    zero_unit_layout(&z, &c, dbrx_param_table(&c), 2, 1, zero_chunk_experts(&c, 2, 1, false, mib), Vc);
    int head = z.n_units - 1;
    size_t d = 64, V = 256;
    REQUIRE(z.runs[0].size() == 2);
    REQUIRE(z.runs[head].size() == 2);
    CHECK(z.runs[0][0].numel == 160 * d); CHECK(z.runs[0][1].numel == 96 * d);
    CHECK(z.runs[head][0].numel == d + 160 * d); CHECK(z.runs[head][1].numel == 96 * d);   // norm_f in chunk 0
    CHECK(z.runs[head][1].flat_off == z.runs[head][0].flat_off + z.runs[head][0].numel);
    CHECK((z.unit_nchunks[0] == 2 && z.unit_nchunks[head] == 2 && zero_vocab_unit(&z, 0) && zero_vocab_unit(&z, head) && !zero_vocab_unit(&z, 1)));
    CHECK(z.work_numel == 3 * 96 * d);                    // the ring: one expert's w1, v1, w2, not a vocabulary chunk
    CHECK(zero_vocab_slot_numel(&z) == V * d + d + 2);    // the head whole, and S elements of slack

    // DBRX-132B, S 64, default --zero-chunk-mib 512: the working set, to the byte
    DbrxConfig b;
    REQUIRE(model_preset_lookup("dbrx-132b", &b));
    long double D = b.d_model, F = b.ffn_hidden, Vb = b.vocab_size, E = b.n_experts;
    MemoryPlan p = memory_plan(&b, 1, 4096, 64, 1, 64, FP8_OFF, EP_CAPACITY_DEFAULT, 512);
    CHECK(p.chunk_experts == 1);
    CHECK(p.vocab_rows == 32248);   // the most rows (x 8) with d + rows d + 63 <= 3 F d
    long double ring = 3 * F * D, vslot = Vb * D + D + 64;
    CHECK(p.slot_params == ring);
    CHECK(p.vocab_slot == 2 * vslot);
    CHECK(p.gathered_slots + p.grad_slots == 2 * (2 + 4) * ring + 2 * vslot);   // 3,611,308,160 B = 3.36 GiB
    CHECK(p.gathered_slots + p.grad_slots == 3611308160.0L);
    // against the vocabulary whole (today's layout before it; its slots V d + d): 6.89 GiB
    int Ec = zero_chunk_experts(&b, 64, 1, false, 512);
    long double whole = (long double)zero_gpu_estimate_bytes(&b, 64, 1, Ec), chunked = (long double)zero_gpu_estimate_bytes(&b, 64, 1, Ec, 0, 32248);
    CHECK(whole - chunked == 2 * (2 + 4) * (Vb * D + D) - (2 * (2 + 4) * ring + 2 * vslot));
    // EP 8 (the --fit layouts): a rank's 2 experts in chunks of 1 (parallel/expert_parallel_cuda.cuh), the ring one expert
    // as without EP, the vocabulary slot the same: 3.36 GiB, where the rank's experts unit whole made it 5.58 GiB
    MemoryPlan q = memory_plan(&b, 1, 4096, 64, 8, 64, FP8_OFF, EP_CAPACITY_DEFAULT, 512);
    CHECK(q.chunk_experts == 1);
    CHECK(q.slot_params == ring);
    CHECK(q.gathered_slots + q.grad_slots == 2 * (2 + 4) * ring + 2 * vslot);   // 3,611,308,160 B
    CHECK(q.gathered_slots + q.grad_slots == 3611308160.0L);
    // (the unit whole, as before: the same vocabulary slot, the ring 2 experts: 2 x 6 B x 3 F d more, 5.58 GiB)
    int Vw = 32248;   // (the same vocabulary chunks in both: they fit either ring)
    CHECK((long double)zero_gpu_estimate_bytes(&b, 64, 8, 0, 0, Vw) - (long double)zero_gpu_estimate_bytes(&b, 64, 8, 1, 0, Vw) ==
          2 * (2 + 4) * 3 * F * D * (E / 8 - 1));
    CHECK(memory_plan(&b, 1, 4096, 64, 8, 64, FP8_CURRENT, EP_CAPACITY_DEFAULT, 512).chunk_experts == 0);   // (FP8: whole)
    // the bound: 4x the vocabulary, the ring's slots the same (the vocabulary slot alone grows, V d)
    DbrxConfig b4 = b;
    b4.vocab_size *= 4;
    MemoryPlan p4 = memory_plan(&b4, 1, 4096, 64, 1, 64, FP8_OFF, EP_CAPACITY_DEFAULT, 512);
    CHECK(p4.slot_params == ring);
    CHECK(p4.vocab_slot == 2 * (4 * Vb * D + D + 64));
}

int main(int argc, char** argv) { return cuda_test_main(argc, argv, "the memory planner", 20261126); }

TEST_CASE("--zero-embedding rows: its buffers and its communicator's NCCL margin by hand (DBRX-132B, seq 4096)") {
    DbrxConfig c;
    REQUIRE(model_preset_lookup("dbrx-132b", &c));
    const long double N = 4096, d = 6144, MiB = PLAN_MIB;
    for (int S : {8, 64}) {
        // --zero-chunk-mib 512 (the default): the vocabulary slot, hence the exchange
        MemoryPlan on = memory_plan(&c, 1, 4096, S, 8, S, FP8_OFF, EP_CAPACITY_DEFAULT, 512);
        g_zero_embedding_rows = 0;
        MemoryPlan off = memory_plan(&c, 1, 4096, S, 8, S, FP8_OFF, EP_CAPACITY_DEFAULT, 512);
        g_zero_embedding_rows = 1;
        REQUIRE(on.vocab_rows > 0);
        // rows BF16 + grads FP32 (N d), index and 0..N-1 (N ints), two tables of (rows of the largest piece) x S entries
        long double rows_per_piece = std::ceil((long double)on.vocab_rows * d / S / d) + 1;
        CHECK(on.emb_exchange >= N * d * 6 + 8 * N);
        CHECK(on.emb_exchange <= N * d * 6 + 8 * N + 2 * 8 * S * rows_per_piece * std::ceil(c.vocab_size / (long double)on.vocab_rows));
        CHECK(off.emb_exchange == 0);
        CHECK(on.allocations == off.allocations + on.emb_exchange);
        // the communicator at 2 of 32 channels: 512 / 16 MiB, 448 / 16 MiB per peer in the node (7), and past one node
        // one shared pool of 2 channels x 16 steps x 512 KiB
        long double want = 32 * MiB + 7 * 28 * MiB + (S > 8 ? 16 * MiB : 0);
        CHECK(on.nccl_emb == want);
        CHECK(on.nccl == off.nccl + want);
        CHECK(on.total == off.total + on.emb_exchange + want);
    }
    // no vocabulary slot (--zero-chunk-mib 0), one rank a shard group (DDP): none of it
    CHECK(memory_plan(&c, 1, 4096, 64, 8, 64, FP8_OFF, EP_CAPACITY_DEFAULT, 0).emb_exchange == 0);
    CHECK(memory_plan(&c, 1, 4096, 1, 8, 8, FP8_OFF, EP_CAPACITY_DEFAULT, 512).nccl_emb == 0);
}
