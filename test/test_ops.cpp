/*
 * test_ops.cpp — unit tests of single operations of the CPU reference against direct formulas:
 * the load-balancing loss, the clip_qkv gradient (and off), RoPE, top-k tie-breaking, the top-k
 * weights' renormalisation (moe_normalize_expert_weights p, or none), the MoE dispatch
 * permutation, causality of attention, the LR schedule, the initialisation (--init) and determinism of the training step.
 */
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest.h>
#include "../model/dbrx.h"

TEST_CASE("load-balancing loss equals its weight for perfectly balanced routing") {
    // E = 4, k = 2, N = 4: token t routes to experts t and t+1 (mod 4), so every expert gets 2
    const int N = 4, E = 4, k = 2;
    real logits[N * E], probs[N * E], lse[N], w[N * k];
    int idx[N * k], counts[E];
    for (int t = 0; t < N; t++)
        for (int e = 0; e < E; e++) logits[t * E + e] = (e == t) ? 3.0f : (e == (t + 1) % E) ? 2.0f : -1.0f * e;
    router_forward(probs, lse, idx, w, counts, logits, N, E, k, 1.0f);
    for (int e = 0; e < E; e++) CHECK(counts[e] == N * k / E);
    for (float weight : {0.05f, 0.1f}) {
        CHECK(lbl_forward(probs, counts, N, E, k, 1, weight) == doctest::Approx(weight).epsilon(1e-6));
        // summed over L layers of balanced routing it is still the weight
        CHECK(3 * lbl_forward(probs, counts, N, E, k, 3, weight) == doctest::Approx(weight).epsilon(1e-6));
    }
    // and collapsed routing (every token to experts 0 and 1, with the probability mass there) costs more
    for (int t = 0; t < N; t++)
        for (int e = 0; e < E; e++) logits[t * E + e] = e < 2 ? 4.0f : 0.0f;
    router_forward(probs, lse, idx, w, counts, logits, N, E, k, 1.0f);
    CHECK(counts[0] == N); CHECK(counts[1] == N); CHECK(counts[2] == 0);
    CHECK(lbl_forward(probs, counts, N, E, k, 1, 0.05f) > 0.05 * 1.5);
}

TEST_CASE("top-k ties go to the lower expert index, weights renormalised") {
    const int E = 5, k = 2;
    real logits[E] = {1.0f, 3.0f, 3.0f, 3.0f, 0.0f}, probs[E], lse[1], w[k];
    int idx[k], counts[E];
    router_forward(probs, lse, idx, w, counts, logits, 1, E, k, 1.0f);
    CHECK(idx[0] == 1); CHECK(idx[1] == 2);
    CHECK(w[0] + w[1] == doctest::Approx(1.0f));
    CHECK(w[0] == doctest::Approx(0.5f));
    real flat[E] = {0, 0, 0, 0, 0};
    int idx3[3];
    real w3[3];
    router_forward(probs, lse, idx3, w3, counts, flat, 1, E, 3, 1.0f);
    CHECK(idx3[0] == 0); CHECK(idx3[1] == 1); CHECK(idx3[2] == 2);
    // and the order of the slots follows the probability, not the index
    real mixed[E] = {0.5f, 0.1f, 2.0f, 0.1f, 1.0f};
    router_forward(probs, lse, idx3, w3, counts, mixed, 1, E, 3, 1.0f);
    CHECK(idx3[0] == 2); CHECK(idx3[1] == 4); CHECK(idx3[2] == 0);
    CHECK(lse[0] == doctest::Approx(std::log(std::exp(0.5) + 2 * std::exp(0.1) + std::exp(2.0) + std::exp(1.0))));
}

TEST_CASE("clip_qkv: clamps the value, gradient zero where clamped, kept at the boundary") {
    real x[6] = {-1.0f, -0.5f, 0.2f, 0.5f, 0.7f, 0.0f}, y[6], d[6] = {1, 1, 1, 1, 1, 1};
    clip_forward(y, x, 6, 0.5f);
    real expect[6] = {-0.5f, -0.5f, 0.2f, 0.5f, 0.5f, 0.0f};
    for (int i = 0; i < 6; i++) CHECK(y[i] == expect[i]);
    clip_backward(d, x, 6, 0.5f);
    real dexpect[6] = {0, 1, 1, 1, 0, 1};
    for (int i = 0; i < 6; i++) CHECK(d[i] == dexpect[i]);
    real d2[2] = {1, 1}, x2[2] = {100, -100}, y2[2];   // DBRX_OFF (HF null) disables the clamp
    clip_forward(y2, x2, 2, DBRX_OFF);
    CHECK(y2[0] == 100); CHECK(y2[1] == -100);
    clip_backward(d2, x2, 2, DBRX_OFF);
    CHECK(d2[0] == 1); CHECK(d2[1] == 1);
    // the op clamps for every clip >= 0, as the original's clamp(-clip, clip) does: 0 is not "off"
    // (config_validate refuses a clip_qkv of 0 before a model is built)
    clip_forward(y2, x2, 2, 0.0f);
    CHECK(y2[0] == 0); CHECK(y2[1] == 0);
    clip_backward(d2, x2, 2, 0.0f);
    CHECK(d2[0] == 0); CHECK(d2[1] == 0);
}

TEST_CASE("top-k weights: divided by their p-norm (moe_normalize_expert_weights p), or left as they are (off)") {
    const int E = 6, k = 3;
    real logits[E] = {0.3f, 2.0f, -1.0f, 1.2f, 0.9f, 0.1f}, probs[E], lse[1], w[k];
    int idx[k], counts[E];
    for (float p : {1.0f, 2.0f, 3.5f, DBRX_OFF}) {
        INFO("p " << dbrx_setting_str(p));
        router_forward(probs, lse, idx, w, counts, logits, 1, E, k, p);
        CHECK(idx[0] == 1); CHECK(idx[1] == 3); CHECK(idx[2] == 4);
        double norm = 0;
        for (int j = 0; j < k; j++) norm += dbrx_is_off(p) ? 0 : std::pow((double)probs[idx[j]], (double)p);
        norm = dbrx_is_off(p) ? 1 : std::pow(norm, 1.0 / p);
        for (int j = 0; j < k; j++) CHECK(w[j] == doctest::Approx(probs[idx[j]] / norm).epsilon(1e-6));
        double wn = 0;   // the renormalised weights have unit p-norm
        for (int j = 0; j < k; j++) wn += std::pow((double)w[j], dbrx_is_off(p) ? 1.0 : (double)p);
        if (!dbrx_is_off(p)) CHECK(wn == doctest::Approx(1.0).epsilon(1e-6));
        else CHECK(wn < 1.0);   // off: the top-k probabilities, which sum to less than 1
    }
}

TEST_CASE("the optional settings: the presets have DBRX's (clip 8, p 1); config_validate accepts them and off") {
    DbrxConfig c;
    REQUIRE(model_preset_lookup("dbrx-tiny", &c));
    CHECK(c.clip_qkv == 8.0f);
    CHECK(c.moe_norm_p == 1.0f);   // DBRX's released config: moe_normalize_expert_weights 1
    // (config_validate exits; what it accepts is checked here, what it refuses by test/test_cli.sh)
    for (float v : {8.0f, DBRX_OFF}) { c.clip_qkv = v; config_validate(&c); }
    for (float v : {1.0f, 2.0f, DBRX_OFF}) { c.moe_norm_p = v; config_validate(&c); }
    CHECK(dbrx_setting_str(DBRX_OFF) == "off");
    CHECK(dbrx_setting_str(8.0f) == "8");
}

TEST_CASE("RoPE matches the direct NeoX formula and its backward is the inverse rotation") {
    const int B = 2, T = 37, H = 4, KV = 2, hd = 16, qd = (H + 2 * KV) * hd;
    const float theta = 500000.0f;
    std::vector<real> cos_t(T * hd / 2), sin_t(T * hd / 2), x(B * T * qd), y;
    rope_tables(cos_t.data(), sin_t.data(), T, hd, theta);
    Rng rng = {1};
    for (real& v : x) v = (real)rng_normal(&rng);
    y = x;
    rope_forward(y.data(), cos_t.data(), sin_t.data(), B, T, H, KV, hd);
    double max_err = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H + 2 * KV; h++)
                for (int i = 0; i < hd; i++) {
                    size_t base = ((size_t)b * T + t) * qd + h * hd;
                    double want;
                    if (h >= H + KV) want = x[base + i];  // V is not rotated
                    else {
                        int j = i % (hd / 2);
                        double ang = t * std::pow((double)theta, -2.0 * j / hd);
                        double x1 = x[base + j], x2 = x[base + j + hd / 2];
                        want = i < hd / 2 ? x1 * std::cos(ang) - x2 * std::sin(ang) : x2 * std::cos(ang) + x1 * std::sin(ang);
                    }
                    max_err = std::max(max_err, std::fabs(want - y[base + i]));
                }
    CHECK(max_err < 1e-5);
    rope_backward(y.data(), cos_t.data(), sin_t.data(), B, T, H, KV, hd);
    for (size_t i = 0; i < x.size(); i++) REQUIRE(y[i] == doctest::Approx(x[i]).epsilon(1e-5));
}

TEST_CASE("MoE dispatch: a stable permutation into expert order and back") {
    const int N = 6, E = 3, k = 2;
    int idx[N * k] = {2, 0, 1, 2, 0, 1, 2, 1, 0, 2, 1, 0}, counts[E] = {0, 0, 0}, offsets[E + 1], row_token[N * k], slot_row[N * k];
    for (int i = 0; i < N * k; i++) counts[idx[i]]++;
    moe_dispatch(offsets, row_token, slot_row, idx, counts, N, E, k);
    CHECK(offsets[0] == 0); CHECK(offsets[1] == 4); CHECK(offsets[2] == 8); CHECK(offsets[3] == 12);
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            int r = slot_row[t * k + j];
            CHECK(row_token[r] == t);
            CHECK(r >= offsets[idx[t * k + j]]);
            CHECK(r < offsets[idx[t * k + j] + 1]);
        }
    for (int e = 0; e < E; e++)   // tokens keep their order inside an expert
        for (int r = offsets[e] + 1; r < offsets[e + 1]; r++) CHECK(row_token[r - 1] < row_token[r]);
}

TEST_CASE("attention is causal: a future token does not change earlier outputs") {
    const int B = 1, T = 12, H = 4, KV = 2, hd = 8, qd = (H + 2 * KV) * hd;
    std::vector<real> qkv(B * T * qd), out1(B * T * H * hd), out2(B * T * H * hd), lse(B * H * T);
    Rng rng = {2};
    for (real& v : qkv) v = (real)rng_normal(&rng);
    attention_forward(out1.data(), lse.data(), qkv.data(), B, T, H, KV, hd);
    for (int i = 0; i < qd; i++) qkv[(T - 1) * qd + i] += 1.0f;   // change the last token only
    attention_forward(out2.data(), lse.data(), qkv.data(), B, T, H, KV, hd);
    for (int i = 0; i < (T - 1) * H * hd; i++) REQUIRE(out1[i] == out2[i]);
    bool last_changed = false;
    for (int i = (T - 1) * H * hd; i < T * H * hd; i++) last_changed |= out1[i] != out2[i];
    CHECK(last_changed);
    // the first position attends only to itself: its output is its own value vector
    for (int h = 0; h < H; h++)
        for (int i = 0; i < hd; i++) CHECK(out2[h * hd + i] == doctest::Approx(qkv[H * hd + KV * hd + (h / (H / KV)) * hd + i]));
}

TEST_CASE("LR schedule: linear warmup, cosine to the floor") {
    CHECK(lr_schedule(0, 100, 1.0f, 10, 0.1f) == doctest::Approx(0.1f));
    CHECK(lr_schedule(9, 100, 1.0f, 10, 0.1f) == doctest::Approx(1.0f));
    CHECK(lr_schedule(10, 100, 1.0f, 10, 0.1f) == doctest::Approx(1.0f));
    CHECK(lr_schedule(55, 100, 1.0f, 10, 0.1f) == doctest::Approx(0.55f));   // half way: (1 + 0.1) / 2
    CHECK(lr_schedule(100, 100, 1.0f, 10, 0.1f) == doctest::Approx(0.1f));
}

// --lr-schedule's other kinds (model/adamw.cuh), against their closed forms written out here: 100 steps, warmup 10 (n = 90
// steps after it), peak 1, floor 0.1; wsd's decay the last 0.2 n = 18 steps, from step 82 (q = (s - 82) / 18)
TEST_CASE("LR schedule: linear, constant, wsd, wsd-sqrt") {
    const int saved = g_lr_schedule;
    const double saved_frac = g_lr_decay_frac;
    g_lr_decay_frac = 0.2;
    for (int k : {LR_LINEAR, LR_CONSTANT, LR_WSD, LR_WSD_SQRT}) {
        g_lr_schedule = k;
        INFO(LR_SCHEDULE_NAMES[k]);
        CHECK(lr_schedule(4, 100, 1.0f, 10, 0.1f) == doctest::Approx(0.5f));   // the warmup: every kind's
        for (int s : {10, 40, 55, 81, 82, 86, 91, 95, 99, 100}) {
            double p = (s - 10) / 90.0, q = std::max(0.0, (s - 82) / 18.0), want = 0;
            if (k == LR_LINEAR) want = 1 - 0.9 * p;
            if (k == LR_CONSTANT) want = 1;
            if (k == LR_WSD) want = 1 - 0.9 * q;
            if (k == LR_WSD_SQRT) want = 0.1 + 0.9 * (1 - std::sqrt(q));
            INFO("step " << s);
            CHECK(lr_schedule(s, 100, 1.0f, 10, 0.1f) == doctest::Approx(want).epsilon(1e-6));
        }
    }
    g_lr_schedule = LR_WSD;   // (the midpoints by hand: q 0.5 at step 91, 0.25 at 86.5: between 86 and 87)
    CHECK(lr_schedule(91, 100, 1.0f, 10, 0.1f) == doctest::Approx(0.55f));
    g_lr_schedule = LR_WSD_SQRT;
    CHECK(lr_schedule(91, 100, 1.0f, 10, 0.1f) == doctest::Approx(0.1 + 0.9 * (1 - std::sqrt(0.5))));
    g_lr_decay_frac = 1e-9;   // (at least one decaying step: the last)
    CHECK(lr_schedule(98, 100, 1.0f, 10, 0.1f) == doctest::Approx(1.0f));
    CHECK(lr_schedule(99, 100, 1.0f, 10, 0.1f) == doctest::Approx(1.0f));   // q = 0 at the decay's first step
    CHECK(lr_schedule(100, 100, 1.0f, 10, 0.1f) == doctest::Approx(0.1f));
    g_lr_schedule = saved;
    g_lr_decay_frac = saved_frac;
}

// --init (model/dbrx_params.h): every matrix's sample std against the formula written out here, LayerNorm weights 1; hf:
// normal(0, init_std); foundry: sqrt(2 / d), the experts' w2 sqrt(2 / F) (its fan mode flipped), out_proj and w2 / sqrt(2 L);
// a shard drawn alone (two ranges) gives
// the whole buffer's bits
TEST_CASE("initialisation: --init hf normal(0, init_std); foundry sqrt(2 / fan_in), residual outputs / sqrt(2 L)") {
    DbrxConfig c;
    REQUIRE(model_preset_lookup("dbrx-tiny", &c));
    c.n_layers = 3; c.d_model = 64; c.n_heads = 2; c.kv_heads = 1; c.head_dim = 32; c.ffn_hidden = 96; c.n_experts = 4;
    c.vocab_size = 300; c.init_std = 0.03f;
    std::vector<ParamInfo> t = dbrx_param_table(&c);
    size_t n = t.back().offset + t.back().numel;
    for (int foundry = 0; foundry < 2; foundry++) {
        g_init_foundry = foundry;
        std::vector<real> all(n), a(n / 3), b(n - n / 3);
        dbrx_init_range(all.data(), 0, n, &c, t, 7);
        dbrx_init_range(a.data(), 0, n / 3, &c, t, 7);
        dbrx_init_range(b.data(), n / 3, n, &c, t, 7);
        a.insert(a.end(), b.begin(), b.end());
        CHECK_MESSAGE(memcmp(a.data(), all.data(), n * sizeof(real)) == 0, "two ranges drawn alone differ from the whole");
        for (const ParamInfo& p : t) {
            double s2 = 0, mean = 0;
            for (size_t i = 0; i < p.numel; i++) { mean += all[p.offset + i]; s2 += (double)all[p.offset + i] * all[p.offset + i]; }
            mean /= p.numel;
            double sd = std::sqrt(s2 / p.numel - mean * mean);
            std::string name = p.name;
            bool residual = name.find("out_proj") != std::string::npos || name.find(".w2") != std::string::npos;
            bool w2 = name.find(".w2") != std::string::npos;
            double want = p.cols == 0 ? 0 : !foundry ? 0.03 : std::sqrt(2.0 / (w2 ? 96 : 64)) / (residual ? std::sqrt(6.0) : 1.0);
            INFO(name << (foundry ? " (foundry)" : " (hf)"));
            if (p.cols == 0) CHECK((mean == 1 && sd == 0));   // a LayerNorm weight
            else CHECK(sd == doctest::Approx(want).epsilon(p.numel >= 10000 ? 0.03 : 0.08));
        }
    }
    g_init_foundry = 0;
}

TEST_CASE("a training step is deterministic: same seed and batch give bit-identical losses") {
    DbrxConfig c;
    REQUIRE(model_preset_lookup("dbrx-tiny", &c));
    c.n_layers = 2;
    const int B = 2, T = 32;
    std::vector<double> runs[2];
    for (int r = 0; r < 2; r++) {
        Dbrx m;
        dbrx_build(&m, &c, B, T, 99);
        std::vector<int> in(B * T), tg(B * T);
        Rng rng = {3};
        for (int i = 0; i < B * T; i++) { in[i] = (int)(rng_u64(&rng) % 257); tg[i] = (int)(rng_u64(&rng) % 257); }
        AdamWConfig o = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
        for (int s = 0; s < 3; s++) {
            dbrx_zero_grad(&m);
            runs[r].push_back(dbrx_forward(&m, in.data(), tg.data()));
            dbrx_backward(&m, in.data(), tg.data(), 1.0f);
            runs[r].push_back(dbrx_update(&m, &o, 1e-3f, s + 1));
        }
        dbrx_free(&m);
    }
    for (size_t i = 0; i < runs[0].size(); i++) CHECK(runs[0][i] == runs[1][i]);
}
