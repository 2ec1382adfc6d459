/*
 * test_decode.cpp — generation with the KV cache (dbrx_decode_step) on the CPU reference and on the CUDA
 * backend (built with g++ -DSIMT_EMULATION: the kernels under the SIMT emulator; or by nvcc, make
 * test-gpu), the sampler (model/sample.h) and the tokenizer's decoding (data/tokenizer.h).
 *
 * The cache cannot drift: a random-initialised model (clip_qkv clamping a good part of q, k, v, GQA 4:2,
 * 4 experts top-2) generates greedily from a prompt, one position at a time through the cache; then one
 * full causal forward (dbrx_forward) runs over the whole generated sequence. At every position:
 *   - the cached step's logits equal the forward's row (CPU: 2e-5 relative to the largest logit, FP32
 *     summation order; GPU: the forward's logits are BF16, the step's FP32: 1e-2);
 *   - the greedy token is the argmax of the forward's row, wherever its top two are further apart than
 *     twice the two rows' largest difference (a near-tie may go either way);
 *   - a step rewrites no earlier position of the cache, and it reads the cache: a planted change of an
 *     early cached key changes the last position's logits (negative control).
 * The GPU's cached steps also match the CPU's (BF16 weights on both: 3e-2 of the largest logit).
 */
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest.h>
#include <vector>
#include "../model/dbrx_cuda.cuh"
#include "../model/sample.h"
#include "../data/tokenizer.h"
#include "cuda_test_helpers.h"

static DbrxConfig small_model(float clip, float norm_p) {
    DbrxConfig c;
    REQUIRE(model_preset_lookup("dbrx-tiny", &c));
    c.d_model = 64; c.n_heads = 4; c.kv_heads = 2; c.head_dim = 16; c.n_layers = 2;
    c.n_experts = 4; c.top_k = 2; c.ffn_hidden = 96; c.vocab_size = 96; c.max_seq_len = 64;
    c.clip_qkv = clip; c.moe_norm_p = norm_p;
    c.init_std = 0.1f;   // peaked logits: most greedy choices are far from a tie
    config_validate(&c);
    return c;
}
static const uint64_t SEED = 4242;
static const int PROMPT = 5, LEN = 40;   // 5 prompt tokens, 35 generated

static std::vector<int> prompt_tokens(const DbrxConfig& c) {
    Rng r = {77};
    std::vector<int> p(PROMPT);
    for (int& t : p) t = (int)(rng_u64(&r) % c.vocab_size);
    return p;
}

// what one greedy generation saw: the sequence (prompt + generated), the cached steps' logits (LEN, V)
struct Decoded { std::vector<int> seq; std::vector<float> logits; };

// greedy generation through the cache; check_cache: earlier cached rows stay untouched by every step
template <typename Model, typename GetCache>
static Decoded greedy(Model* m, const std::vector<int>& prompt, GetCache cache_rows) {
    const DbrxConfig& c = m->cfg;
    int V = c.vocab_size;
    Decoded d;
    d.seq = prompt;
    dbrx_decode_alloc(m, LEN);
    for (int pos = 0; pos < LEN; pos++) {
        std::vector<float> before = cache_rows(pos);   // rows 0..pos-1 of every layer
        const auto* lg = dbrx_decode_step(m, d.seq[pos], pos);
        CHECK(cache_rows(pos) == before);
        d.logits.insert(d.logits.end(), lg, lg + V);
        if (pos + 1 < LEN && pos + 1 >= PROMPT) {
            std::vector<float> row(lg, lg + V);
            d.seq.push_back(sample_argmax(row.data(), V, NULL));
        }
    }
    REQUIRE((int)d.seq.size() == LEN);
    return d;
}

// the cached steps against one full forward's logits (LEN, V) of the same sequence
static void compare_with_forward(const Decoded& d, const std::vector<float>& full, int V, double tol, const std::string& what) {
    double worst = 0;
    int checked = 0, near_ties = 0;
    for (int pos = 0; pos < LEN; pos++) {
        const float* a = &d.logits[(size_t)pos * V];
        const float* b = &full[(size_t)pos * V];
        double maxabs = 0, diff = 0;
        for (int i = 0; i < V; i++) { maxabs = std::max(maxabs, (double)std::fabs(b[i])); diff = std::max(diff, (double)std::fabs(a[i] - b[i])); }
        INFO(what << ": position " << pos << ": max |cached - full| " << diff << ", max |logit| " << maxabs);
        CHECK(diff <= tol * maxabs);
        worst = std::max(worst, diff / maxabs);
        if (pos + 1 >= PROMPT && pos + 1 < LEN) {   // a generated token: the argmax of the full forward's row
            int want = sample_argmax(b, V, NULL);
            float second = -INFINITY;
            for (int i = 0; i < V; i++) if (i != want) second = std::max(second, b[i]);
            if (b[want] - second <= 2 * diff) { near_ties++; continue; }   // (within the two rows' difference: either may win)
            INFO(what << ": position " << pos << ": greedy token " << d.seq[pos + 1] << ", argmax of the full forward " << want);
            CHECK(d.seq[pos + 1] == want);
            checked++;
        }
    }
    MESSAGE(what << ": worst |cached - full| / max|logit| " << worst << "; greedy = argmax of the full forward at " << checked
                 << " positions (" << near_ties << " near-ties skipped)");
    CHECK(checked >= (LEN - PROMPT) * 3 / 4);
}

static std::vector<float> cpu_forward_logits(Dbrx* m, const std::vector<int>& seq) {
    std::vector<int> tg(seq.size(), 0);
    dbrx_forward(m, seq.data(), tg.data(), 0.0f);
    return std::vector<float>(m->logits, m->logits + seq.size() * m->cfg.vocab_size);
}

static void cpu_case(float clip, float norm_p) {
    DbrxConfig c = small_model(clip, norm_p);
    Dbrx m;
    dbrx_build(&m, &c, 1, LEN, SEED);
    int kvw = 2 * c.kv_heads * c.head_dim;
    auto rows = [&](int pos) {
        std::vector<float> r;
        for (int l = 0; l < c.n_layers; l++) r.insert(r.end(), m.dec.kv[l], m.dec.kv[l] + (size_t)pos * kvw);
        return r;
    };
    Decoded d = greedy(&m, prompt_tokens(c), rows);
    std::vector<float> full = cpu_forward_logits(&m, d.seq);
    compare_with_forward(d, full, c.vocab_size, 2e-5, "cpu");
    // negative control: the step reads the cache (an early key changed changes the last position's logits)
    std::vector<float> last(d.logits.end() - c.vocab_size, d.logits.end());
    for (int i = 0; i < c.kv_heads * c.head_dim; i++) m.dec.kv[0][i] += 1.0f;   // position 0's keys, layer 0
    const real* again = dbrx_decode_step(&m, d.seq[LEN - 1], LEN - 1);
    double moved = 0;
    for (int i = 0; i < c.vocab_size; i++) moved = std::max(moved, (double)std::fabs(again[i] - last[i]));
    MESSAGE("cpu: position 0's cached keys changed: the last position's logits move by " << moved);
    CHECK(moved > 1e-3);
    dbrx_free(&m);
}

TEST_CASE("CPU: greedy generation through the KV cache equals the argmax of a full forward at every position") {
    cpu_case(1.0f, 1.0f);
}
TEST_CASE("CPU: the same without clip_qkv and without renormalising the top-k weights") {
    cpu_case(DBRX_OFF, DBRX_OFF);
}

TEST_CASE("CUDA: greedy generation through the KV cache equals the argmax of a full forward, and the CPU's cached steps") {
    DbrxConfig c = small_model(1.0f, 1.0f);
    DbrxGPU g;
    dbrx_build(&g, &c, 1, LEN, SEED);
    int kvw = 2 * c.kv_heads * c.head_dim, V = c.vocab_size;
    auto rows = [&](int pos) {
        std::vector<float> r;
        for (int l = 0; l < c.n_layers; l++) {
            std::vector<float> x = get_bf16(g.dec.kv[l], (size_t)pos * kvw);
            r.insert(r.end(), x.begin(), x.end());
        }
        return r;
    };
    double t0 = now_seconds();
    Decoded d = greedy(&g, prompt_tokens(c), rows);
    MESSAGE("cuda: " << LEN << " cached steps in " << now_seconds() - t0 << " s");
    std::vector<int> tg(LEN, 0);
    dbrx_forward(&g, d.seq.data(), tg.data(), 0.0f);
    std::vector<float> full = get_bf16(g.logits, (size_t)LEN * V);
    compare_with_forward(d, full, V, 1e-2, "cuda");

    // the CPU's cached steps on the same (BF16-rounded) weights, fed the GPU's sequence
    Dbrx m;
    dbrx_build(&m, &c, 1, LEN, SEED);
    for (size_t i = 0; i < m.num_params; i++) m.params[i] = __bfloat162float(__float2bfloat16(m.params[i]));
    dbrx_decode_alloc(&m, LEN);
    double worst = 0;
    for (int pos = 0; pos < LEN; pos++) {
        const real* lg = dbrx_decode_step(&m, d.seq[pos], pos);
        double maxabs = 0, diff = 0;
        for (int i = 0; i < V; i++) {
            maxabs = std::max(maxabs, (double)std::fabs(lg[i]));
            diff = std::max(diff, (double)std::fabs(lg[i] - d.logits[(size_t)pos * V + i]));
        }
        INFO("position " << pos << ": max |gpu - cpu| " << diff << ", max |logit| " << maxabs);
        CHECK(diff <= 3e-2 * maxabs);
        worst = std::max(worst, diff / maxabs);
    }
    MESSAGE("cuda against the cpu's cached steps: worst max|d| / max|logit| " << worst);
    dbrx_free(&m);
    dbrx_free(&g);
}

TEST_CASE("sampler: greedy ties, the valid ids, top-k, temperature, seeds") {
    float z[6] = {1.0f, 3.0f, 3.0f, -2.0f, 5.0f, 0.5f};
    unsigned char valid[6] = {1, 1, 1, 1, 0, 1};   // id 4 (the largest) is no token: never drawn
    CHECK(sample_argmax(z, 6, NULL) == 4);
    CHECK(sample_argmax(z, 6, valid) == 1);   // the tie 1 / 2: the lower id
    Rng r = {1};
    CHECK(sample_token(z, 6, valid, 0.0f, 0, &r) == 1);   // temperature 0: greedy
    for (int i = 0; i < 200; i++) {
        int t = sample_token(z, 6, valid, 1.0f, 2, &r);   // top-2 of the valid ids: 1 and 2 only
        CHECK((t == 1 || t == 2));
        CHECK(sample_token(z, 6, valid, 5.0f, 0, &r) != 4);
    }
    // frequencies against softmax(z / T) over the valid ids, within 5 sigma
    const int n = 20000;
    const float T = 1.5f;
    std::vector<int> count(6, 0);
    Rng s = {99};
    for (int i = 0; i < n; i++) count[sample_token(z, 6, valid, T, 0, &s)]++;
    double sum = 0;
    for (int i = 0; i < 6; i++) if (valid[i]) sum += std::exp(z[i] / T);
    for (int i = 0; i < 6; i++) {
        double p = valid[i] ? std::exp(z[i] / T) / sum : 0, sigma = std::sqrt(n * p * (1 - p));
        INFO("id " << i << ": " << count[i] << " draws, expected " << n * p);
        CHECK(std::fabs(count[i] - n * p) <= 5 * sigma + 1e-9);
    }
    // the same seed, the same draws
    Rng a = {7}, b = {7};
    for (int i = 0; i < 50; i++) CHECK(sample_token(z, 6, NULL, 1.0f, 0, &a) == sample_token(z, 6, NULL, 1.0f, 0, &b));
}

TEST_CASE("tokenizer: bytes round trip with end-of-text; cl100k round trip with DBRX's specials (when the ranks are there)") {
    Tokenizer t;
    tokenizer_init(&t, TOKENIZER_BYTES, "", 384);
    std::string text = "Mr. Speaker,\n\tthe <|endoftext|>caf\xC3\xA9 \xF0\x9F\x98\x80";
    std::vector<int> ids = tokenizer_encode(&t, text);
    CHECK(ids[13] == '\t'); CHECK(ids[18] == BYTES_EOT);
    CHECK(tokenizer_decode(&t, ids) == text);
    int valid = 0;
    for (unsigned char v : t.valid) valid += v;
    CHECK(valid == BYTES_VOCAB);
    CHECK(text_printable("a\nb\\c\x01\xff") == "a\\nb\\\\c\\x01\\xff");
    CHECK(text_utf8("ok\xff\xC3\xA9") == "ok\xEF\xBF\xBD\xC3\xA9");
    const char* ranks = "dev/data/.cache/cl100k_base.tiktoken";
    FILE* f = fopen(ranks, "rb");
    if (!f) { MESSAGE("skipped the cl100k half: no " << ranks << " (dev/data/setup_tiktoken.sh)"); return; }
    fclose(f);
    Tokenizer c;
    tokenizer_init(&c, TOKENIZER_CL100K, ranks, DBRX_VOCAB);
    std::string s = "<|im_start|>user\nHello, world! 12345 caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD<|im_end|><|endoftext|>";
    std::vector<int> x = tokenizer_encode(&c, s);
    CHECK(x[0] == 100278); CHECK(x.back() == CL100K_EOT); CHECK(x[x.size() - 2] == 100279);
    CHECK(tokenizer_decode(&c, x) == s);
    int n = 0;
    for (unsigned char v : c.valid) n += v;
    CHECK(n == 100256 + DBRX_NUM_SPECIALS);   // the ranks 0..100255 and the 8 specials; the padding is no token
    CHECK(!c.valid[100256]); CHECK(!c.valid[100300]); CHECK(c.valid[100276]);
}

int main(int argc, char** argv) { return cuda_test_main(argc, argv, "test_decode", 2024); }
