/*
 * test_ring_attention.cpp — ring attention's arithmetic (model/attention_ring.h, --context-parallel) against
 * the full-sequence CPU reference (attention_forward/attention_backward of model/attention.cuh), with the
 * ring simulated in one process: N virtual CP ranks, each with its two balanced chunks, the K|V blocks
 * visited in the ring's order (rank r at step s holds rank r-s's block) and every block's dK|dV accumulated
 * by the ranks in the order the ring carries it. The MPI transport around it is parallel/context_parallel.h's,
 * tested end to end by test/test_cp.sh. Head_dim 128; GQA 6:1 (DBRX's 48:8 ratio, a slice of its heads) at
 * T 1024 and 4:2; negative controls: a block merged with the wrong lse, the balancing skipped.
 */
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest.h>
#include <vector>
#include "../model/dbrx.h"

typedef struct { double out, lse, dqkv; } RingErr;   // max |ring - reference| / max |reference|

static double rel_err(const std::vector<real>& a, const std::vector<real>& ref) {
    double m = 0, r = 0;
    for (size_t i = 0; i < a.size(); i++) { m = std::fmax(m, std::fabs((double)a[i] - ref[i])); r = std::fmax(r, std::fabs((double)ref[i])); }
    return m / r;
}

// One (B, T, H, KV, hd) problem through the reference and the simulated ring of n ranks. data_balance: the
// layout the tokens are handed out in; attn_balance: the layout the attention assumes (both 1 in the product;
// a mismatch is the "balancing skipped" control). wrong_lse: merge each rank's blocks with the first block's lse.
static RingErr ring_vs_reference(int B, int T, int H, int KV, int hd, int n, int data_balance, int attn_balance, bool wrong_lse,
                                 uint64_t seed) {
    int qd = (H + 2 * KV) * hd, C = H * hd, kvw = 2 * KV * hd, Tl = T / n;
    Rng rng = {seed};
    std::vector<real> qkv((size_t)B * T * qd), dout((size_t)B * T * C);
    for (auto& x : qkv) x = (real)(rng_normal(&rng) * 1.5);   // scores spread: the softmax is far from uniform
    for (auto& x : dout) x = (real)rng_normal(&rng);
    std::vector<real> out((size_t)B * T * C), lse((size_t)B * H * T), dqkv((size_t)B * T * qd);
    attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, KV, hd);
    attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, H, KV, hd);

    // each rank's rows: the global positions of its local rows (the data loader's chunks)
    std::vector<std::vector<int>> pos(n, std::vector<int>(Tl));
    std::vector<std::vector<real>> lq(n), ldo(n), lo(n), llse(n), kv(n), dkv(n), ldq(n), D(n);
    for (int r = 0; r < n; r++) {
        cp_positions(pos[r].data(), T, n, r, data_balance);
        lq[r].resize((size_t)B * Tl * qd); ldo[r].resize((size_t)B * Tl * C);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < Tl; t++) {
                size_t g = (size_t)b * T + pos[r][t], l = (size_t)b * Tl + t;
                memcpy(&lq[r][l * qd], &qkv[g * qd], qd * sizeof(real));
                memcpy(&ldo[r][l * C], &dout[g * C], C * sizeof(real));
            }
        kv[r].resize((size_t)B * Tl * kvw); dkv[r].assign((size_t)B * Tl * kvw, 0);
        ring_pack_kv(kv[r].data(), lq[r].data(), (size_t)B * Tl, H, KV, hd);
        lo[r].resize((size_t)B * Tl * C); llse[r].resize((size_t)B * H * Tl);
        ldq[r].assign((size_t)B * Tl * qd, 0); D[r].resize((size_t)B * H * Tl);
    }
    auto chunks = [&](int r, int g[2]) { g[0] = cp_chunk(r, 0, n, attn_balance); g[1] = cp_chunk(r, 1, n, attn_balance); };
    // forward: rank r, step s, the block of rank r - s
    for (int r = 0; r < n; r++) {
        int gq[2], gk[2];
        chunks(r, gq);
        if (!wrong_lse) {
            attention_ring_begin(lo[r].data(), llse[r].data(), B, Tl, H, hd);
            for (int s = 0; s < n; s++) {
                chunks((r - s + n) % n, gk);
                attention_ring_forward(lo[r].data(), llse[r].data(), lq[r].data(), kv[(r - s + n) % n].data(), B, Tl, H, KV, hd, gq, gk);
            }
        } else {   // each block's partial alone, then merged, each with the first block's lse
            std::vector<real> po(lo[r].size()), pl(llse[r].size()), l0;
            attention_ring_begin(lo[r].data(), llse[r].data(), B, Tl, H, hd);
            for (int s = 0; s < n; s++) {
                chunks((r - s + n) % n, gk);
                attention_ring_begin(po.data(), pl.data(), B, Tl, H, hd);
                attention_ring_forward(po.data(), pl.data(), lq[r].data(), kv[(r - s + n) % n].data(), B, Tl, H, KV, hd, gq, gk);
                if (s == 0) l0 = pl;
                for (int b = 0; b < B; b++)
                    for (int h = 0; h < H; h++)
                        for (int t = 0; t < Tl; t++) {
                            size_t li = ((size_t)b * H + h) * Tl + t, oi = ((size_t)b * Tl + t) * C + h * hd;
                            if (pl[li] != -INFINITY) ring_merge(&lo[r][oi], &llse[r][li], &po[oi], l0[li], hd);
                        }
            }
        }
        attention_ring_rowdot(D[r].data(), ldo[r].data(), lo[r].data(), B, Tl, H, hd);
    }
    // backward: the ring's order for every block (rank src, then src+1, ...)
    for (int s = 0; s < n; s++)
        for (int r = 0; r < n; r++) {
            int gq[2], gk[2], src = (r - s + n) % n;
            chunks(r, gq); chunks(src, gk);
            attention_ring_backward(ldq[r].data(), dkv[src].data(), ldo[r].data(), lq[r].data(), kv[src].data(), llse[r].data(), D[r].data(),
                                    B, Tl, H, KV, hd, gq, gk);
        }
    // back to global order
    std::vector<real> go(out.size()), gl(lse.size()), gd(dqkv.size());
    for (int r = 0; r < n; r++) {
        ring_unpack_dkv(ldq[r].data(), dkv[r].data(), (size_t)B * Tl, H, KV, hd);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < Tl; t++) {
                size_t g = (size_t)b * T + pos[r][t], l = (size_t)b * Tl + t;
                memcpy(&go[g * C], &lo[r][l * C], C * sizeof(real));
                memcpy(&gd[g * qd], &ldq[r][l * qd], qd * sizeof(real));
                for (int h = 0; h < H; h++) gl[((size_t)b * H + h) * T + pos[r][t]] = llse[r][((size_t)b * H + h) * Tl + t];
            }
    }
    return RingErr{rel_err(go, out), rel_err(gl, lse), rel_err(gd, dqkv)};
}

static void check_close(const RingErr& e) {
    INFO("relative errors: out ", e.out, ", lse ", e.lse, ", dqkv ", e.dqkv);
    CHECK(e.out < 2e-5);
    CHECK(e.lse < 2e-6);
    CHECK(e.dqkv < 5e-5);
}

TEST_CASE("ring attention = full attention: head_dim 128, GQA 6:1 (DBRX's 48:8 on 6 heads), T 1024, CP 4") {
    check_close(ring_vs_reference(1, 1024, 6, 1, 128, 4, 1, 1, false, 11));
}
TEST_CASE("ring attention = full attention: head_dim 128, GQA 12:2, T 256, CP 2, batch 2") {
    check_close(ring_vs_reference(2, 256, 12, 2, 128, 2, 1, 1, false, 12));
}
TEST_CASE("ring attention = full attention: head_dim 128, GQA 4:2, T 512, CP 2 and CP 4; CP 1 is the local attention") {
    for (int n : {1, 2, 4}) { CAPTURE(n); check_close(ring_vs_reference(1, 512, 4, 2, 128, n, 1, 1, false, 13 + n)); }
}
TEST_CASE("negative control: a block merged with the wrong lse fails") {
    RingErr ok = ring_vs_reference(1, 256, 4, 2, 128, 2, 1, 1, false, 21);
    RingErr bad = ring_vs_reference(1, 256, 4, 2, 128, 2, 1, 1, true, 21);
    CHECK(ok.out < 2e-5);
    CHECK(bad.out > 1e-2);
}
TEST_CASE("negative control: the balancing skipped (contiguous chunks, balanced masks) fails; contiguous both ways is right") {
    RingErr bad = ring_vs_reference(1, 256, 4, 2, 128, 4, 0, 1, false, 31);
    CHECK(bad.out > 1e-2);
    check_close(ring_vs_reference(1, 256, 4, 2, 128, 4, 0, 0, false, 31));
}
TEST_CASE("causal load balancing: every rank the same (query, key) pairs; contiguous chunks not") {
    for (int n : {2, 4, 8}) {
        const int c = 16, T = 2 * n * c;
        std::vector<long> bal(n, 0), con(n, 0);
        for (int r = 0; r < n; r++)
            for (int i = 0; i < 2; i++)
                for (int t = 0; t < c; t++) {   // the keys of each local query: positions <= its own
                    bal[r] += cp_chunk(r, i, n, 1) * c + t + 1;
                    con[r] += cp_chunk(r, i, n, 0) * c + t + 1;
                }
        long total = (long)T * (T + 1) / 2;
        CAPTURE(n);
        for (int r = 0; r < n; r++) CHECK(bal[r] * n == total);
        CHECK(con[n - 1] > 2 * con[0]);
    }
}
