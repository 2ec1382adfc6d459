/*
 * train_fit.h — --dry-run --fit: the cheapest setting that fits a run of this model, batch and sequence on
 * --plan-gpus GPUs of --plan-device's memory, found by --dry-run's own plan (parallel/memory_plan.h) over
 * the settings that trade memory for work or communication:
 *   --shard-group-size S   the powers of two that divide the GPUs (S > 8 gathers over the network)
 *   --expert-parallel n    1, 2, 4, 8, 16 where n divides the experts and S (n <= 8 stays in a node)
 *   --ep-capacity-factor   2 (the default), 1.25, 1 (with EP: the rows a rank's experts' buffers are planned for; a
 *                          routing that needs more grows them at run time: the last line prices that growth)
 *   --ep-layout            packed, and spread where the shard group crosses nodes (S > 8) and the ranks sharding
 *                          the same experts, S/n of them, fit in a node (S/n <= 8): the same plan (memory_plan.h)
 *   --recompute            none, attn, swiglu, attn+swiglu, moe, moe+attn, block (all layers)
 *   --compress-acts        the run's own (--compress-acts SPEC or off), else none, swiglu, attn, swiglu,attn (all layers,
 *                          never a class the --recompute setting recomputes everywhere; not
 *                          bit-identical, so an exact setting of the same recomputed FLOPs ranks first)
 *   --zero-embedding       rows (the default), and gather where rows has a place (the GPU store's vocabulary slot: its
 *                          buffers and its communicator's NCCL margin are rows' only, parallel/zero_gpu_embedding.cuh);
 *                          the run's own where it gives one
 *   --context-parallel N   1, 2, 4, 8, 16 where N divides the GPUs and 2N divides --seq (train_flags.h's
 *                          context_parallel_check, parallel/context_parallel.h): the CP group is N consecutive ranks
 *                          inside the data-parallel ranks, so the plan is the one of T/N tokens per sequence
 *                          (dry_run_report's own call of memory_plan); the run's own degree only where it gives one
 * "Cheapest" is an order, not a time (the step-time model, make predict, times a setting):
 *   0. a shard group that crosses the network (S > 8): the higher EP degree up to 8 (each GPU gathers 1/n of the
 *      experts' bytes over the network), and EP inside a node before EP across nodes. Predicted (make predict,
 *      DBRX-132B seq 4096 on 64 H100s): shard group 64 without EP (it fits since the experts are gathered in
 *      chunks, --zero-chunk-mib) with --recompute swiglu 17.4 s per step, against 3.8 s with EP 8 and --recompute
 *      moe: the gathers across nodes, not the recomputation, set the step;
 *   0b. the experts' shard group inside a node (S <= 8, or spread with S/n <= 8): where the GPUs are more than a
 *      shard group of 8 nodes can keep so, HSDP (replicas of such a group) before a larger shard group. Predicted
 *      (make predict, DBRX-132B seq 4096 on 256 H100s, BF16 moments, session 54): HSDP 64 x 4 spread with
 *      --recompute swiglu 1955.9 ms (the replicas' gradient sums beside the backward), against 2228.7 with them after
 *      it; the ZeRO-3 pick over 256 (EP 8 packed: its expert shard group of 32 ranks across nodes) 2768.2 (FP32
 *      moments), its expert gathers and reduce-scatters 1.38 + 1.37 s;
 *   1. the smallest --context-parallel degree: CP adds an exchange of K|V in every layer, forward and backward
 *      (N-1 and 2N-1 blocks per rank), and beyond 8 its consecutive ranks cross nodes; a CP degree is taken only
 *      where the one below it fits nothing (or only what rule 0 ranks after), not to save recomputation;
 *   2. the fewest recomputed FLOPs (model/recompute.h: what HFU adds over MFU), then the fewest compressed classes.
 *      Predicted (make predict, DBRX-132B seq 4096 on 256 H100s, session 33): the pick, S 256 EP 8 --compress-acts
 *      swiglu, 2847.7 ms per step; HSDP 64 x 4 spread, which needs --recompute moe to fit, 3173.2 ms;
 *   2b. the embedding's rows exchanged before its table gathered (fewer bytes through the shard group: 1.7 -> 1.6 s
 *      predicted at 64 GPUs, dev/bench/results_predicted.md), after the recomputation: gathering the table
 *      rather than recomputing more is the cheaper trade;
 *   3. a shard group inside a node (S <= 8) before one that crosses the network;
 *   4. the higher EP degree inside a node (each rank gathers 1/n of the experts' weights);
 *   5. the larger --ep-capacity-factor (more room for uneven routing planned before a step must grow the buffers);
 *   6. --ep-layout spread before packed (the twins of one setting). Predicted (make predict, DBRX-132B seq 4096
 *      on 64 H100s, parallel/README.md "The EP layout"): spread moves the experts' gathers and reduce-scatters
 *      into a node and the exchange across nodes, where it overlaps the experts;
 *   7. the smaller shard group (fewer ranks in every gather), then the larger headroom.
 * A setting fits when its plan leaves --fit-headroom GiB (default 4) of the device free: the plan's NCCL and CUDA
 * margins are predicted, not measured.
 * It prints the ranked fitting settings (at most 8) and the flags of the first, or that nothing fits; with EP, what each
 * +0.25 of the first's --ep-capacity-factor would cost (the memory a growth past the plan takes from the headroom).
 */
#pragma once
#include <algorithm>
#include <string>
#include <vector>
#include "parallel/memory_plan.h"

typedef struct {
    int S, n, spread;         // spread: --ep-layout spread
    int cp;                   // --context-parallel
    double cap;
    std::string rc;           // the --recompute spec ("" none)
    std::string ca;           // the --compress-acts spec ("" none)
    long double total;        // the plan's total per GPU
    double extra;             // recomputed FLOPs per token / the MFU count
    int gather;               // --zero-embedding gather where rows has a place
} FitCandidate;

static inline bool fit_better(const FitCandidate& a, const FitCandidate& b) {
    auto xnode = [](const FitCandidate& f) { return f.S > 8 ? std::min(f.n, 8) : 8; };   // rule 0: EP against cross-node gathers
    if (xnode(a) != xnode(b)) return xnode(a) > xnode(b);
    bool an = a.n <= 8, bn = b.n <= 8;   // (EP 16 has the gathers of EP 8 but an all-to-all across nodes)
    if (an != bn) return an;
    // rule 0b: the experts' shard group inside a node (spread: S/n consecutive ranks; packed or no EP: S/n ranks a
    // node apart unless S <= 8): their weights' gathers and gradients' reduce-scatters stay off the network
    auto exin = [](const FitCandidate& f) { return f.S <= 8 || (f.spread && f.S / f.n <= 8); };
    if (exin(a) != exin(b)) return exin(a);
    if (a.cp != b.cp) return a.cp < b.cp;   // (rule 1: the smallest CP)
    if (a.extra != b.extra) return a.extra < b.extra;
    auto ncls = [](const std::string& ca) { return ca.empty() ? 0 : 1 + (int)std::count(ca.begin(), ca.end(), ','); };
    if (ncls(a.ca) != ncls(b.ca)) return ncls(a.ca) < ncls(b.ca);   // (exact before compressed, fewer classes first)
    if (a.gather != b.gather) return a.gather < b.gather;            // (rule 2b: the embedding's rows exchanged)
    if ((a.S <= 8) != (b.S <= 8)) return a.S <= 8;
    if (a.n != b.n) return a.n > b.n;
    if (a.cap != b.cap) return a.cap > b.cap;
    if (a.spread != b.spread) return a.spread > b.spread;
    if (a.S != b.S) return a.S < b.S;
    return a.total < b.total;
}

// a compressed class that the recompute spec recomputes in every layer keeps nothing: the setting without it plans
// the same, so --fit proposes only that one (swiglu is recomputed by swiglu, moe and block; LayerNorm 1's output by block)
static inline bool fit_compresses_recomputed(const std::string& rc, const std::string& ca) {
    bool swiglu = rc.find("swiglu") != std::string::npos || rc.find("moe") != std::string::npos || rc == "block";
    return (ca.find("swiglu") != std::string::npos && swiglu) || (ca.find("attn") != std::string::npos && rc == "block");
}

static inline std::string fit_flags(const FitCandidate& f) {
    std::string s = "--shard-group-size " + std::to_string(f.S);
    if (f.n > 1) {
        char b[64];
        snprintf(b, sizeof b, " --expert-parallel %d --ep-capacity-factor %g", f.n, f.cap);
        s += b;
    }
    if (f.spread) s += " --ep-layout spread";
    if (!f.rc.empty()) s += " --recompute " + f.rc;
    if (!f.ca.empty()) s += " --compress-acts " + f.ca;
    if (f.cp > 1) s += " --context-parallel " + std::to_string(f.cp);
    if (f.gather) s += " --zero-embedding gather";
    return s;
}

// gpus: the run's GPUs; capacity: the bytes of one GPU (dry_run_report's); the plan's other inputs from args
static inline void fit_report(const TrainArgs& args, const DbrxConfig& cfg, int gpus, long double capacity) {
    static const char* specs[] = {"", "attn", "swiglu", "attn,swiglu", "moe", "moe,attn", "block"};
    static const double caps[] = {2.0, 1.25, 1.0};
    Fp8Recipe fp8 = fp8_recipe_parse(args.fp8.recipe.c_str());
    double fpt = flops_per_token(&cfg, args.run.seq);
    RecomputeSpec saved = g_recompute, saved_ca = g_compress;
    std::vector<std::string> cas = {g_compress.text};   // (the run's --compress-acts; none given: none and every class mix)
    bool own_ca = !args.run.compress_acts.empty();
    if (!own_ca) cas.insert(cas.end(), {"swiglu", "attn", "swiglu,attn"});
    long double headroom = (long double)args.run.fit_headroom * 1073741824.0L;   // (--fit-headroom GiB)
    std::vector<FitCandidate> fits;
    int tried = 0;
    auto plan = [&](int S, int n, int cp, double cap) {   // (the specs: g_recompute, g_compress)
        MemoryPlan p = memory_plan(&cfg, args.run.batch, args.run.seq / cp, S, n, gpus, fp8, cap, args.parallel.zero_chunk_mib,
                                   args.parallel.grad_reduce_dtype == "bf16", args.parallel.ep_chunks, args.fp8.gather);
        memory_plan_cp(&p, &cfg, cp);   // (CP: the GPU ring's buffers and communicator, as dry_run_report's plan)
        return p;
    };
    bool own_cp = flag_given(&args, "--context-parallel");   // (given: that degree only, checked by context_parallel_check)
    for (int cp = 1; cp <= 16; cp *= 2) {
        if (gpus % cp || (cp > 1 && args.run.seq % (2 * cp))) continue;   // (context_parallel_check and cp_init's rules)
        if (own_cp && cp != args.parallel.context_parallel) continue;
        for (int S = 1; S <= gpus; S *= 2) {
            if (gpus % S) continue;
            for (int n = 1; n <= 16; n *= 2) {
                if (cfg.n_experts % n || (n > 1 && (S % n || gpus % n)) || (n > 1 && S == 1)) continue;
                for (double cap : caps) {
                    if (n == 1 && cap != caps[0]) continue;
                    for (const char* rc : specs)
                    for (const std::string& ca : cas) {
                        if (!own_ca && fit_compresses_recomputed(rc, ca)) continue;   // (the same plan as without that class)
                        g_recompute = recompute_parse(rc);   // (memory_plan reads the run's specs)
                        g_compress = recompute_parse(ca, "--compress-acts", RC_COMPRESS_GRANS);
                        MemoryPlan p = plan(S, n, cp, cap);
                        double extra = recompute_flops_per_token(&g_recompute, cfg.n_layers, cfg.d_model, qkv_dim(&cfg), cfg.ffn_hidden,
                                                                 cfg.top_k, args.run.seq) / fpt;
                        // --zero-embedding rows, and gather where rows has a place: the same plan less rows' own terms
                        long double emb = p.emb_exchange + p.nccl_emb;
                        // the spread twin (the same plan): the expert shard group in a node
                        const bool twin = n > 1 && S > 8 && S > n && S / n <= 8;
                        for (int gather = 0; gather < (emb > 0 ? 2 : 1); gather++) {
                            tried += twin ? 2 : 1;   // (every setting, fitting or not: the report's "N of M settings fit")
                            long double total = p.total - (gather ? emb : 0);
                            if (total + headroom > capacity) continue;
                            fits.push_back({S, n, 0, cp, n > 1 ? cap : 0.0, rc, g_compress.text, total, extra, gather});
                            if (twin) fits.push_back({S, n, 1, cp, cap, rc, g_compress.text, total, extra, gather});
                        }
                    }
                }
            }
        }
    }
    g_recompute = saved; g_compress = saved_ca;
    std::sort(fits.begin(), fits.end(), fit_better);
    printf("fit (--fit: %d settings planned for %d GPU(s), micro-batch %d x %d, FP8 %s, %.2f GiB to spare (--fit-headroom); ranked by EP up to 8 where the shard group "
           "crosses nodes, the smallest --context-parallel, recomputed FLOPs, the embedding's rows exchanged, a shard group inside a node, EP inside a node and higher, a larger --ep-capacity-factor, --ep-layout spread, a smaller shard group: train_fit.h):\n",
           tried, gpus, args.run.batch, args.run.seq, args.fp8.recipe.c_str(), (double)args.run.fit_headroom);
    if (fits.empty()) {
        printf("fit: NOTHING FITS in %.2f GiB per GPU with %.2f GiB to spare at %d GPU(s): lower --batch, --seq or --fit-headroom, "
               "more GPUs or a bigger device (--context-parallel 1-16 planned where it divides the GPUs and 2N --seq)\n",
               (double)(capacity / 1073741824.0L), (double)args.run.fit_headroom, gpus);
        return;
    }
    for (size_t i = 0; i < fits.size() && i < 8; i++)
        printf("  %zu. %-90s %7.2f GiB, headroom %6.2f GiB, recomputed FLOPs +%.1f%%\n", i + 1, fit_flags(fits[i]).c_str(),
               (double)(fits[i].total / 1073741824.0L), (double)((capacity - fits[i].total) / 1073741824.0L), 100 * fits[i].extra);
    printf("fit: %s (%zu of %d settings fit; time the first few with make predict FLAGS='...')\n", fit_flags(fits[0]).c_str(),
           fits.size(), tried);
    const FitCandidate& f = fits[0];
    if (f.n > 1) {   // the EP buffers grow past the plan when a routing needs more (parallel/expert_parallel_grow.cuh): their price
        g_recompute = recompute_parse(f.rc.c_str());
        g_compress = recompute_parse(f.ca.c_str(), "--compress-acts", RC_COMPRESS_GRANS);
        long double more = plan(f.S, f.n, f.cp, f.cap + 0.25).total - plan(f.S, f.n, f.cp, f.cap).total;
        g_recompute = saved; g_compress = saved_ca;
        printf("fit note: its expert-parallel buffers are planned for --ep-capacity-factor %g x the mean rows a rank receives; a routing that "
               "sends a rank more grows them in that step, each +0.25 of the factor %.2f GiB per GPU of the %.2f the plan leaves free, "
               "--fit-headroom's included (the factor "
               "a run's routing needs: its log's ep_recv_max over tokens x top-k)\n", f.cap, (double)(more / 1073741824.0L),
               (double)((capacity - f.total) / 1073741824.0L));
    }
}
