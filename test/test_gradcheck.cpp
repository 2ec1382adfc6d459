/*
 * test_gradcheck.cpp — finite-difference check of the hand-written backward pass, for each way of
 * renormalising the top-k router weights (moe_normalize_expert_weights 1, off, 2). Built with
 * -DCPU_REAL=double, so the whole CPU reference runs in double precision: central differences
 * with h = 1e-5 are then accurate to ~1e-10 and the tolerance below (1e-7 + 1e-5 |g|) is far
 * tighter than any real gradient bug (a wrong term is off by the size of the gradient itself).
 * Every parameter tensor is checked (sampled entries plus its largest ones), and the rows of wte
 * that the batch uses, i.e. the gradient w.r.t. the input embeddings.
 */
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest.h>
#include <algorithm>
#include "../model/dbrx.h"

static_assert(sizeof(real) == sizeof(double), "test_gradcheck must be built with -DCPU_REAL=double");

static DbrxConfig small_config() {
    DbrxConfig c;
    c.d_model = 16; c.n_heads = 4; c.kv_heads = 2; c.head_dim = 4; c.n_layers = 2; c.ffn_hidden = 12;
    c.n_experts = 4; c.top_k = 2; c.vocab_size = 32; c.max_seq_len = 8; c.rope_theta = 10000.0f;
    c.clip_qkv = 0.9f;   // with init_std 0.25 a good share of qkv values is clamped: the clamp path is checked too
    c.moe_norm_p = 1.0f;
    c.ln_eps = 1e-5f; c.moe_loss_weight = 0.05f; c.z_loss_weight = 0.01f; c.init_std = 0.25f;
    return c;
}

static double total_loss(Dbrx* m, const int* in, const int* tg) {
    dbrx_forward(m, in, tg);
    return m->ce_loss + m->lbl_loss + m->z_loss;
}

// the whole check for one renormalisation of the top-k router weights (moe_normalize_expert_weights)
static void gradcheck(float norm_p) {
    DbrxConfig c = small_config();
    c.moe_norm_p = norm_p;
    INFO("moe_normalize_expert_weights " << dbrx_setting_str(norm_p));
    const int B = 2, T = 8, N = B * T;
    Dbrx m;
    dbrx_build(&m, &c, B, T, 3);
    std::vector<int> in(N), tg(N);
    Rng rng = {11};
    for (int i = 0; i < N; i++) { in[i] = (int)(rng_u64(&rng) % c.vocab_size); tg[i] = (int)(rng_u64(&rng) % c.vocab_size); }

    dbrx_zero_grad(&m);
    total_loss(&m, in.data(), tg.data());
    dbrx_backward(&m, in.data(), tg.data(), 1.0f);
    std::vector<real> grads(m.grads, m.grads + m.num_params);

    // the clamp must be active somewhere, or its gradient would go unchecked
    size_t clamped = 0, total = 0;
    for (int l = 0; l < c.n_layers; l++)
        for (size_t i = 0; i < (size_t)N * qkv_dim(&c); i++, total++) clamped += std::fabs(m.acts[l].qkv_pre[i]) > c.clip_qkv;
    MESSAGE("clamped qkv values: " << clamped << " of " << total);
    CHECK(clamped > total / 20);
    CHECK(clamped < total / 2);

    const double h = 1e-5;
    for (const ParamInfo& p : m.table) {
        std::vector<size_t> idx;
        if (std::string(p.name) == "transformer.wte.weight") {
            for (int t = 0; t < N; t += 3) idx.push_back((size_t)in[t] * c.d_model + (t % c.d_model));  // input embeddings
        } else {
            for (int s = 0; s < 12; s++) idx.push_back(rng_u64(&rng) % p.numel);
        }
        // plus the three largest gradients of the tensor
        std::vector<size_t> order(p.numel);
        for (size_t i = 0; i < p.numel; i++) order[i] = i;
        std::partial_sort(order.begin(), order.begin() + 3, order.end(), [&](size_t a, size_t b) {
            return std::fabs(grads[p.offset + a]) > std::fabs(grads[p.offset + b]); });
        idx.insert(idx.end(), order.begin(), order.begin() + 3);

        double max_err = 0, max_g = 0;
        for (size_t i : idx) {
            real* w = m.params + p.offset + i;
            real keep = *w;
            *w = keep + h; double lp = total_loss(&m, in.data(), tg.data());
            *w = keep - h; double lm = total_loss(&m, in.data(), tg.data());
            *w = keep;
            double fd = (lp - lm) / (2 * h), an = grads[p.offset + i];
            double err = std::fabs(fd - an) - 1e-5 * std::fabs(fd);
            max_err = std::max(max_err, err);
            max_g = std::max(max_g, std::fabs(an));
            CHECK_MESSAGE(std::fabs(fd - an) <= 1e-7 + 1e-5 * std::fabs(fd),
                          p.name << "[" << i << "]: analytic " << an << " vs finite difference " << fd);
        }
        MESSAGE(p.name << ": max |grad| sampled " << max_g << ", max excess error " << max_err);
        CHECK_MESSAGE(max_g > 1e-4, p.name << ": sampled gradients are all ~0, the check would prove nothing");
    }
    dbrx_free(&m);
}

TEST_CASE("finite differences match the backward pass for every parameter tensor (top-k weights / their sum: DBRX)") {
    gradcheck(1.0f);
}
TEST_CASE("finite differences match the backward pass for every parameter tensor (top-k weights not renormalised)") {
    gradcheck(DBRX_OFF);
}
TEST_CASE("finite differences match the backward pass for every parameter tensor (top-k weights / their L2 norm)") {
    gradcheck(2.0f);
}

TEST_CASE("rows of wte that the batch does not use get exactly zero gradient") {
    DbrxConfig c = small_config();
    const int B = 1, T = 8;
    Dbrx m;
    dbrx_build(&m, &c, B, T, 5);
    int in[8] = {1, 2, 3, 1, 2, 3, 1, 2}, tg[8] = {2, 3, 1, 2, 3, 1, 2, 3};
    dbrx_zero_grad(&m);
    total_loss(&m, in, tg);
    dbrx_backward(&m, in, tg, 1.0f);
    for (int v = 0; v < c.vocab_size; v++) {
        double s = 0;
        for (int i = 0; i < c.d_model; i++) s += std::fabs(m.g.wte[v * c.d_model + i]);
        if (v >= 1 && v <= 3) CHECK(s > 0);
        else CHECK(s == 0);
    }
    dbrx_free(&m);
}
