/*
 * test_checkpoint.cpp — unit tests of the checkpoint building blocks: CRC-32C against its published
 * check value (hardware and table paths), the JSON reader on good and malformed input, shortest float
 * formatting, bf16/f16 conversions against their bit patterns, the safetensors export layout, the
 * config comparison, that a rank's shard of the initialisation drawn alone equals the same range
 * of the whole model's, the FP8 scaling state's round trip through its manifest section
 * (bit-exact, history length and margin changes, malformed sections refused), the sharding layout (a
 * block's experts sharded along the expert dimension), and checkpoints written under other layouts
 * (format 2: whole blocks as units; format 3: runs) loading to the right flat positions.
 */
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest.h>
#include "../checkpoint/ckpt.h"
#include "../checkpoint/hf.h"

TEST_CASE("crc32c: the published check value, both implementations, incremental") {
    const char* s = "123456789";
    CHECK(crc32c_update(0, s, 9) == 0xE3069283u);
    CHECK(crc32c_update_sw(0, s, 9) == 0xE3069283u);
    CHECK(crc32c_update(0, "", 0) == 0u);
    std::vector<unsigned char> buf(100003);
    Rng r = {7};
    for (auto& b : buf) b = (unsigned char)rng_u64(&r);
    uint32_t whole = crc32c_update(0, buf.data(), buf.size());
    CHECK(whole == crc32c_update_sw(0, buf.data(), buf.size()));
    uint32_t parts = crc32c_update(crc32c_update(crc32c_update(0, buf.data(), 5), buf.data() + 5, 40000), buf.data() + 40005, 60000 - 2);
    CHECK(parts == whole);
    buf[777] ^= 0x10;   // one flipped bit changes it
    CHECK(crc32c_update(0, buf.data(), buf.size()) != whole);
}

TEST_CASE("json: values, exact integers, spans") {
    std::string t = "{\"a\": [1, -2.5e3, true, null], \"b\": {\"c\": \"x\\\"y\\u00e9\\n\"}, \"big\": 18446744073709551615}";
    JsonValue v;
    std::string err;
    REQUIRE(json_parse(t.data(), t.size(), &v, &err));
    const JsonValue* a = json_get(&v, "a");
    REQUIRE(a);
    REQUIRE(a->items.size() == 4);
    int64_t i;
    double d;
    CHECK((json_i64(&a->items[0], &i) && i == 1));
    CHECK((json_double(&a->items[1], &d) && d == -2500.0));
    CHECK(a->items[2].kind == JsonValue::BOOL);
    CHECK(a->items[3].kind == JsonValue::NUL);
    CHECK(json_get(json_get(&v, "b"), "c")->text == "x\"y\xc3\xa9\n");
    uint64_t u;
    CHECK((json_u64(json_get(&v, "big"), &u) && u == 18446744073709551615ull));
    const JsonValue* b = json_get(&v, "b");
    CHECK(t.substr(b->begin, b->end - b->begin) == "{\"c\": \"x\\\"y\\u00e9\\n\"}");
    CHECK(json_get(&v, "missing") == nullptr);
}

TEST_CASE("json: malformed input is an error with a position, never a crash") {
    const char* bad[] = {"", "{", "{\"a\": }", "[1, 2,]", "{\"a\" 1}", "\"abc", "[1] x", "{\"a\": tru}", "\"\\q\"", "\"a\x01\""};
    for (const char* s : bad) {
        JsonValue v;
        std::string err;
        CHECK_MESSAGE(!json_parse(s, strlen(s), &v, &err), s);
        CHECK(!err.empty());
    }
    std::string deep(200, '[');   // nesting is bounded
    deep += std::string(200, ']');
    JsonValue v;
    std::string err;
    CHECK(!json_parse(deep.data(), deep.size(), &v, &err));
    CHECK(err.find("nesting") != std::string::npos);
}

TEST_CASE("json_float: the shortest text that reads back as the same float") {
    CHECK(json_float(0.05f) == "0.05");
    CHECK(json_float(1e-5f) == "1e-05");
    CHECK(json_float(500000.0f) == "500000");
    Rng r = {3};
    for (int k = 0; k < 10000; k++) {
        float x = (float)(rng_normal(&r) * pow(10.0, (int)(rng_u64(&r) % 20) - 10));
        CHECK((float)strtod(json_float(x).c_str(), NULL) == x);
    }
}

TEST_CASE("bf16 and f16 conversions against their bit patterns") {
    auto bits = [](uint32_t u) { float f; memcpy(&f, &u, 4); return f; };
    CHECK(f32_to_bf16(1.0f) == 0x3F80);
    CHECK(f32_to_bf16(bits(0x3F808000u)) == 0x3F80);   // halfway: to even (down)
    CHECK(f32_to_bf16(bits(0x3F818000u)) == 0x3F82);   // halfway: to even (up)
    CHECK(f32_to_bf16(bits(0x3F808001u)) == 0x3F81);   // above halfway: up
    CHECK(f32_to_bf16(-2.0f) == 0xC000);
    CHECK(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
    CHECK(bf16_to_f32(f32_to_bf16(bits(0x7F800000u))) == bits(0x7F800000u));   // inf stays inf
    for (uint32_t h = 0; h < 65536; h++) {   // every bf16 value survives f32 and back
        float f = bf16_to_f32((uint16_t)h);
        if (!std::isnan(f)) CHECK(f32_to_bf16(f) == h);
    }
    CHECK(f16_to_f32(0x3C00) == 1.0f);
    CHECK(f16_to_f32(0xC000) == -2.0f);
    CHECK(f16_to_f32(0x0001) == ldexpf(1.0f, -24));   // smallest subnormal
    CHECK(f16_to_f32(0x7BFF) == 65504.0f);
    CHECK(std::isinf(f16_to_f32(0x7C00)));
}

TEST_CASE("safetensors export layout: offsets contiguous, headers 8-byte aligned, split by size") {
    DbrxConfig c;
    model_preset_lookup("dbrx-tiny", &c);
    c.n_layers = 2;
    std::vector<ParamInfo> t = dbrx_param_table(&c);
    for (size_t es : {(size_t)2, (size_t)4}) {
        std::vector<StPlace> place;
        std::vector<std::string> files, headers;
        hf_plan(t, es, (uint64_t)4 << 20, &place, &files, &headers);
        CHECK(files.size() > 1);
        for (const std::string& h : headers) CHECK((8 + h.size()) % 8 == 0);
        for (size_t i = 0; i < t.size(); i++) {
            CHECK(place[i].end - place[i].begin == t[i].numel * es);
            if (i > 0 && place[i].file == place[i - 1].file) CHECK(place[i].begin == place[i - 1].end);
            if (i > 0 && place[i].file != place[i - 1].file) CHECK(place[i].begin == 0);
        }
        for (const std::string& h : headers) {   // each header is valid JSON naming its tensors
            JsonValue v;
            std::string err;
            CHECK(json_parse(h.data(), h.size(), &v, &err));
        }
    }
}

TEST_CASE("config comparison lists every mismatched field") {
    DbrxConfig c;
    model_preset_lookup("dbrx-tiny", &c);
    std::string saved = ckpt_config_json(&c);
    JsonValue v;
    std::string err;
    REQUIRE(json_parse(saved.data(), saved.size(), &v, &err));
    CHECK(ckpt_config_mismatch(&v, &c) == "");
    DbrxConfig d = c;
    d.n_layers = 7;
    d.rope_theta = 5e5f;
    std::string m = ckpt_config_mismatch(&v, &d);
    CHECK(m.find("n_layers 4 (checkpoint) vs 7 (this run)") != std::string::npos);
    CHECK(m.find("rope_theta 10000 (checkpoint) vs 500000 (this run)") != std::string::npos);
    std::string hf = hf_config_json(&c, "float32");
    REQUIRE(json_parse(hf.data(), hf.size(), &v, &err));
    CHECK(hf_config_mismatch(&v, &c) == "");
    std::string mh = hf_config_mismatch(&v, &d);
    CHECK(mh.find("n_layers") != std::string::npos);
    CHECK(mh.find("attn_config.rope_theta") != std::string::npos);
}

static JsonValue parsed(const std::string& text) {
    JsonValue v;
    std::string err;
    REQUIRE_MESSAGE(json_parse(text.data(), text.size(), &v, &err), err);
    return v;
}
// text with the first occurrence of `from` replaced by `to`
static std::string edited(std::string text, const std::string& from, const std::string& to) {
    size_t at = text.find(from);
    REQUIRE_MESSAGE(at != std::string::npos, from);
    return text.replace(at, from.size(), to);
}

TEST_CASE("clip_qkv and moe_normalize_expert_weights: off is null in checkpoints and exports; old checkpoints still load") {
    DbrxConfig c;
    model_preset_lookup("dbrx-tiny", &c);
    DbrxConfig off = c;
    off.clip_qkv = DBRX_OFF;
    off.moe_norm_p = DBRX_OFF;
    // checkpoint manifests: off round-trips as null; each setting compared
    std::string saved = ckpt_config_json(&off);
    CHECK(saved.find("\"clip_qkv\": null") != std::string::npos);
    CHECK(saved.find("\"moe_normalize_expert_weights\": null") != std::string::npos);
    JsonValue v = parsed(saved);
    CHECK(ckpt_config_mismatch(&v, &off) == "");
    std::string m = ckpt_config_mismatch(&v, &c);
    CHECK(m.find("clip_qkv null (checkpoint) vs 8 (this run)") != std::string::npos);
    CHECK(m.find("moe_normalize_expert_weights null (checkpoint) vs 1 (this run)") != std::string::npos);
    // a checkpoint of the program before: clip_qkv 0 (or any number <= 0) meant off, and there was no
    // moe_normalize_expert_weights (it renormalised by the sum: p = 1)
    std::string old = edited(edited(ckpt_config_json(&c), "\"clip_qkv\": 8", "\"clip_qkv\": 0"),
                             "\"moe_normalize_expert_weights\": 1, ", "");
    v = parsed(old);
    DbrxConfig clip_off = c;
    clip_off.clip_qkv = DBRX_OFF;
    CHECK(ckpt_config_mismatch(&v, &clip_off) == "");
    CHECK(ckpt_config_mismatch(&v, &c) == "clip_qkv 0 (off) (checkpoint) vs 8 (this run)");
    v = parsed(edited(old, "\"clip_qkv\": 0", "\"clip_qkv\": -1"));
    CHECK(ckpt_config_mismatch(&v, &clip_off) == "");
    DbrxConfig l2 = clip_off;
    l2.moe_norm_p = 2.0f;
    CHECK(ckpt_config_mismatch(&v, &l2) == "moe_normalize_expert_weights missing (checkpoint) vs 2 (this run)");

    // Hugging Face config.json: off is null, and reads back as off
    std::string hf = hf_config_json(&off, "float32");
    CHECK(hf.find("\"clip_qkv\": null") != std::string::npos);
    CHECK(hf.find("\"moe_normalize_expert_weights\": null") != std::string::npos);
    v = parsed(hf);
    CHECK(hf_config_check(&v) == "");
    CHECK(hf_config_mismatch(&v, &off) == "");
    m = hf_config_mismatch(&v, &c);
    CHECK(m.find("attn_config.clip_qkv null (config.json) vs 8 (this run)") != std::string::npos);
    CHECK(m.find("ffn_config.moe_normalize_expert_weights null (config.json) vs 1 (this run)") != std::string::npos);
    std::string hf2 = hf_config_json(&l2, "float32");
    CHECK(hf2.find("\"moe_normalize_expert_weights\": 2") != std::string::npos);
    v = parsed(hf2);
    CHECK(hf_config_mismatch(&v, &l2) == "");
    // absent: DbrxConfig's defaults (no clamp; p = 1)
    std::string dflt = edited(edited(hf, "\"clip_qkv\": null, ", ""), "\"moe_normalize_expert_weights\": null, ", "");
    v = parsed(dflt);
    CHECK(hf_config_check(&v) == "");
    DbrxConfig hf_default = c;
    hf_default.clip_qkv = DBRX_OFF;
    CHECK(hf_config_mismatch(&v, &hf_default) == "");
    CHECK(hf_config_mismatch(&v, &off) == "ffn_config.moe_normalize_expert_weights absent (DbrxConfig's default: 1) (config.json) vs off (this run)");
    // what the original would do differently, or train_dbrx does not implement: refused, the field named
    for (const char* bad : {"0", "-8", "\"8\"", "true"}) {
        v = parsed(edited(hf, "\"clip_qkv\": null", std::string("\"clip_qkv\": ") + bad));
        INFO("clip_qkv " << bad);
        CHECK(hf_config_check(&v).rfind(std::string("attn_config.clip_qkv ") + bad + " must be a positive number or null", 0) == 0);
    }
    for (const char* bad : {"0", "0.5", "-1", "true"}) {
        v = parsed(edited(hf, "\"moe_normalize_expert_weights\": null", std::string("\"moe_normalize_expert_weights\": ") + bad));
        INFO("moe_normalize_expert_weights " << bad);
        CHECK(hf_config_check(&v).rfind(std::string("ffn_config.moe_normalize_expert_weights ") + bad + " must be a number >= 1", 0) == 0);
    }
    v = parsed(edited(hf, "\"moe_top_k\"", "\"uniform_expert_assignment\": true, \"moe_top_k\""));
    CHECK(hf_config_check(&v).rfind("ffn_config.uniform_expert_assignment true: ", 0) == 0);
    v = parsed(edited(hf, "\"moe_top_k\"", "\"uniform_expert_assignment\": false, \"moe_top_k\""));
    CHECK(hf_config_check(&v) == "");
}

TEST_CASE("a shard of the initialisation drawn alone equals that range of the whole model's") {
    DbrxConfig c;
    model_preset_lookup("dbrx-tiny", &c);
    c.n_layers = 1;
    std::vector<ParamInfo> t = dbrx_param_table(&c);
    size_t n = t.back().offset + t.back().numel;
    std::vector<real> whole(n);
    dbrx_init_range(whole.data(), 0, n, &c, t, 1234);
    Rng r = {11};
    for (int k = 0; k < 50; k++) {
        size_t lo = rng_u64(&r) % n, len = rng_u64(&r) % 70000, hi = lo + len < n ? lo + len : n;
        std::vector<real> part(hi - lo);
        dbrx_init_range(part.data(), lo, hi, &c, t, 1234);
        CHECK(memcmp(part.data(), whole.data() + lo, (hi - lo) * sizeof(real)) == 0);
    }
}

// a dbrx-tiny of one layer with FP8 on (activations for a (1, 8) micro-batch)
static void fp8_model(Dbrx* m, Fp8Recipe recipe, int history, int margin) {
    DbrxConfig c;
    model_preset_lookup("dbrx-tiny", &c);
    c.n_layers = 1;
    dbrx_build_shape(m, &c, 1, 8);
    Fp8Config f = {};   // (value-initialised: fields added later stay zero)
    f.recipe = recipe; f.history_len = history; f.margin = margin;
    dbrx_enable_fp8(m, &f);
}
static uint32_t bits_of(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static std::string fp8_restore_text(Dbrx* m, const std::string& text, std::string* notes) {
    JsonValue v;
    std::string err;
    REQUIRE(json_parse(text.data(), text.size(), &v, &err));
    return ckpt_fp8_state_restore(m, &v, notes);
}

TEST_CASE("fp8 state: every scale and amax history entry round-trips bit for bit; other settings are noted") {
    Dbrx a, b;
    fp8_model(&a, FP8_DELAYED, 16, 0);
    fp8_model(&b, FP8_DELAYED, 16, 0);
    std::vector<Fp8MetaRef> ma = dbrx_fp8_metas(&a), mb = dbrx_fp8_metas(&b);
    REQUIRE(ma.size() == 14);
    // awkward values: random bit patterns of every magnitude, subnormals, the largest float, an infinity
    Rng r = {5};
    const float odd[] = {1.17549435e-38f, 1.4e-45f, 3.40282347e+38f, INFINITY, 0.1f, 0.0f};
    for (size_t i = 0; i < ma.size(); i++) {
        Fp8Meta* mt = ma[i].meta;
        mt->filled = i == 13 ? 16 : (int)i;   // empty, partly filled and full histories
        for (int k = 0; k < mt->filled; k++) {
            uint32_t u = (uint32_t)rng_u64(&r) & 0x7FFFFFFFu;
            float x;
            memcpy(&x, &u, 4);
            mt->history[k] = std::isfinite(x) ? x : odd[k % 6];
        }
        if (i >= 1 && i <= 6) mt->history[0] = odd[i - 1];
        mt->scale = fp8_scale_for(mt->history[0], ma[i].fmt, 0);
    }
    std::string text = ckpt_fp8_state_json(&a), notes;
    CHECK(text.find("\"inf\"") != std::string::npos);
    CHECK(fp8_restore_text(&b, text, &notes) == "");
    CHECK(notes == "");
    for (size_t i = 0; i < ma.size(); i++) {
        CHECK(mb[i].meta->filled == ma[i].meta->filled);
        CHECK(bits_of(mb[i].meta->scale) == bits_of(ma[i].meta->scale));
        for (int k = 0; k < ma[i].meta->filled; k++) CHECK(bits_of(mb[i].meta->history[k]) == bits_of(ma[i].meta->history[k]));
    }
    // a shorter history keeps the newest entries and derives the scale from them (margin 1 as well)
    Dbrx c;
    fp8_model(&c, FP8_DELAYED, 4, 1);
    notes.clear();
    CHECK(fp8_restore_text(&c, text, &notes) == "");
    CHECK(notes.find("--fp8-amax-history is 4, the checkpoint's was 16: each amax history keeps its newest 4 entries") != std::string::npos);
    CHECK(notes.find("--fp8-margin is 1, the checkpoint's was 0") != std::string::npos);
    std::vector<Fp8MetaRef> mc = dbrx_fp8_metas(&c);
    const Fp8Meta* src = ma[7].meta;   // 7 entries saved
    REQUIRE(src->filled == 7);
    CHECK(mc[7].meta->filled == 4);
    float hmax = 0;
    for (int k = 0; k < 4; k++) {
        CHECK(bits_of(mc[7].meta->history[k]) == bits_of(src->history[3 + k]));
        hmax = std::fmax(hmax, src->history[3 + k]);
    }
    CHECK(bits_of(mc[7].meta->scale) == bits_of(fp8_scale_for(hmax, mc[7].fmt, 1)));
    // another recipe: a note, nothing carried over
    Dbrx d;
    fp8_model(&d, FP8_CURRENT, 16, 0);
    notes.clear();
    CHECK(fp8_restore_text(&d, text, &notes) == "");
    CHECK(notes == "note: resume: the checkpoint was saved with --fp8 delayed, this run uses --fp8 current: its delayed-scaling state is not used\n");
    for (Dbrx* m : {&a, &b, &c, &d}) dbrx_free(m);
}

TEST_CASE("fp8 state: a malformed section is an error and changes nothing") {
    Dbrx a, b;
    fp8_model(&a, FP8_DELAYED, 16, 0);
    fp8_model(&b, FP8_DELAYED, 16, 0);
    for (Fp8MetaRef& r : dbrx_fp8_metas(&a)) { r.meta->filled = 2; r.meta->history[0] = 1.5f; r.meta->history[1] = 2.5f; r.meta->scale = 3; }
    std::string good = ckpt_fp8_state_json(&a), notes;
    auto edit = [&](const std::string& from, const std::string& to) {
        std::string t = good;
        size_t at = t.find(from);
        REQUIRE(at != std::string::npos);
        return t.replace(at, from.size(), to);
    };
    const std::pair<std::string, std::string> bad[] = {
        {"\"filled\": 2", "\"filled\": 3"}, {"\"filled\": 2", "\"filled\": 17"}, {"\"recipe\": \"delayed\"", "\"recipe\": \"late\""},
        {"\"amax_history_len\": 16", "\"amax_history_len\": 0"}, {"[1.5, 2.5]", "[1.5, \"x\"]"}, {"\"scale\": 3", "\"scale\": \"3\""},
        {"blocks.0.qkv.x", "blocks.0.qkv.y"}, {"\"margin\": 0", "\"margin\": -1"}};
    for (auto& e : bad) {
        std::string err = fp8_restore_text(&b, edit(e.first, e.second), &notes);
        CHECK_MESSAGE(err.rfind("manifest.json: fp8", 0) == 0, e.second);
    }
    // one operand too few
    std::string t = good;
    size_t last = t.rfind(",\n    {");
    REQUIRE(last != std::string::npos);
    t = t.substr(0, last) + "\n  ]}";
    CHECK(fp8_restore_text(&b, t, &notes) == "manifest.json: fp8: 13 operands, the model has 14");
    for (Fp8MetaRef& r : dbrx_fp8_metas(&b)) CHECK((r.meta->filled == 0 && r.meta->scale == 1.0f));
    CHECK(notes == "");
    CHECK(fp8_restore_text(&b, good, &notes) == "");
    for (Fp8MetaRef& r : dbrx_fp8_metas(&b)) CHECK((r.meta->filled == 2 && r.meta->history[1] == 2.5f && r.meta->scale == 3.0f));
    dbrx_free(&a);
    dbrx_free(&b);
}

// ---------------------------------------------------------------------------------------------
// the sharding layout (parallel/zero.h) and checkpoints written under other layouts

// ep_chunk_layout (parallel/expert_parallel.h, --ep-overlap-chunks) on every rank of an EP group of n from the same
// counts: each rank's plan (ep_plan, the counts' exchange answered from the matrix) and layout, and what they agree on
static std::vector<int> g_ep_counts;   // (n, E): rank q's rows per expert
static void ep_counts_exchange(void* ctx, const void*, const size_t*, void* recv, const size_t*, int host) {
    REQUIRE(host == 1);   // (only the counts are exchanged here)
    (void)ctx;
    memcpy(recv, g_ep_counts.data(), g_ep_counts.size() * sizeof(int));
}
TEST_CASE("ep_chunk_layout: permutations, the unchunked plan at N = 1, ranks agree chunk by chunk, every row once, balanced chunks, "
          "one expert a chunk") {
    int n = 8, E = 16, El = E / n;
    for (int uneven = 0; uneven < 2; uneven++) {
        g_ep_counts.assign((size_t)n * E, 6);   // balanced: every rank routes 6 rows to every expert
        if (uneven)
            for (int q = 0; q < n; q++) for (int e = 0; e < E; e++) g_ep_counts[(size_t)q * E + e] = (q * 7 + e * 3) % 11 * (e != 5);   // expert 5: none
        for (int N : {1, 2, 3, 4, 8, 16}) {   // (slices of an expert: C = El N chunks)
            std::vector<EpPlan> pl(n);
            std::vector<EpChunks> ch(n);
            for (int r = 0; r < n; r++) {
                ExpertParallel ep;
                ep.n = n; ep.rank = r; ep.all_to_allv = ep_counts_exchange;
                std::vector<int> off(E + 1, 0);
                for (int e = 0; e < E; e++) off[e + 1] = off[e] + g_ep_counts[(size_t)r * E + e];
                ep_plan(&ep, &pl[r], &g_ep_counts[(size_t)r * E], off.data(), E, 0);
                ep_chunk_layout(&ep, &pl[r], off.data(), E, N, &ch[r]);
                INFO("uneven " << uneven << " N " << N << " rank " << r);
                const EpChunks& k = ch[r];
                const int C = k.C;
                REQUIRE(C == (N == 1 ? 1 : El * N));
                size_t S = off[E], R = pl[r].R;
                REQUIRE(k.stage.size() == S); REQUIRE(k.perm.size() == R); REQUIRE(k.inv.size() == R);
                for (size_t i = 0; i < S; i++) CHECK(k.stage[k.unstage[i]] == (int)i);
                for (size_t i = 0; i < R; i++) CHECK(k.inv[k.perm[i]] == (int)i);
                if (C == 1) { for (size_t i = 0; i < S; i++) CHECK(k.stage[i] == (int)i); CHECK(k.perm == pl[r].perm); }
                for (int p = 0; p < n; p++) {   // the chunks add up to the unchunked exchange
                    size_t out = 0, in = 0;
                    for (int c = 0; c < C; c++) { out += k.send_rows[(size_t)c * n + p]; in += k.recv_rows[(size_t)c * n + p]; }
                    CHECK(out == pl[r].send_rows[p]); CHECK(in == pl[r].recv_rows[p]);
                }
                for (int j = 0; j < El; j++) {   // each expert's slices: its rows, each once
                    std::vector<int> seen(R, 0);
                    for (int c = 0; c < C; c++) for (int i = k.first[(size_t)j * C + c]; i < k.last[(size_t)j * C + c]; i++) seen[i]++;
                    for (int i = pl[r].loffsets[j]; i < pl[r].loffsets[j + 1]; i++) CHECK(seen[i] == 1);
                }
                for (int j = 0; j < El && C > 1; j++)   // chunk c holds rows of local expert c / N only
                    for (int c = 0; c < C; c++)
                        if (j != c / N) CHECK(k.first[(size_t)j * C + c] == k.last[(size_t)j * C + c]);
            }
            const int C = ch[0].C;
            for (int c = 0; c < C; c++)   // what q sends r in chunk c is what r expects from q
                for (int q = 0; q < n; q++)
                    for (int r = 0; r < n; r++) CHECK(ch[q].send_rows[(size_t)c * n + r] == ch[r].recv_rows[(size_t)c * n + q]);
            if (!uneven && N <= n && n % N == 0)   // balanced routing: every rank sends 1/C of its rows in every chunk
                for (int r = 0; r < n; r++)
                    for (int c = 0; c < C; c++) {
                        size_t out = 0;
                        for (int p = 0; p < n; p++) out += ch[r].send_rows[(size_t)c * n + p];
                        CHECK(out == (size_t)E * 6 / C);
                    }
        }
    }
}

TEST_CASE("zero layout: a block's experts are a unit of their own, sharded along the expert dimension") {
    DbrxConfig c;
    model_preset_lookup("dbrx-tiny", &c);   // E 16
    std::vector<ParamInfo> t = dbrx_param_table(&c);
    int E = c.n_experts, F = c.ffn_hidden, d = c.d_model;
    for (int S : {2, 4, 8, 16}) {
        Zero z;
        zero_unit_layout(&z, &c, t, S);
        REQUIRE(z.n_units == 2 * c.n_layers + 2);
        for (int l = 0; l < c.n_layers; l++) {
            int u = dbrx_experts_unit(l);
            REQUIRE(z.runs[u].size() == 3);   // w1, v1, w2
            CHECK(z.runs[dbrx_block_unit(l)].size() == 1);
            const ParamInfo& w1 = t[unit_first_entry(u, &c)];
            CHECK(std::string(w1.name).find("mlp.w1") != std::string::npos);
            for (int r = 0; r < S; r++) {   // rank r: experts [r*E/S, (r+1)*E/S) of each of the three, nothing else
                int k = 0;
                shard_run_pieces(z.runs[u], r, [&](size_t lo, size_t hi, size_t at) {
                    const ParamInfo& p = t[unit_first_entry(u, &c) + k];
                    size_t per = (size_t)(E / S) * F * d;
                    CHECK(lo == p.offset + r * per);
                    CHECK(hi == lo + per);
                    CHECK(at == k * per);
                    k++;
                });
                CHECK(k == 3);
            }
        }
    }
    // S not dividing E*F (16 * 256 here: 3 does not divide it): the experts are one padded run, as the other units
    Zero z;
    zero_unit_layout(&z, &c, t, 3);
    CHECK(((size_t)E * F) % 3 != 0);
    CHECK(z.runs[dbrx_experts_unit(0)].size() == 1);
    CHECK(z.shard_numel[dbrx_experts_unit(0)] == (3 * (size_t)E * F * d + 2) / 3);
}

TEST_CASE("--ep-layout: packed and spread hold every element once; spread's expert shard group is consecutive ranks; "
          "copies between the layouts move every element to its place") {
    DbrxConfig c;
    model_preset_lookup("dbrx-tiny", &c);   // E 16
    c.n_layers = 2;
    std::vector<ParamInfo> t = dbrx_param_table(&c);
    size_t total = 0;
    for (const ParamInfo& p : t) total = std::max(total, p.offset + p.numel);
    for (int S : {4, 8}) for (int n : {2, 4}) {
        if (S <= n) continue;
        int Q = S / n;
        Zero L[2];
        for (int sp = 0; sp < 2; sp++) zero_unit_layout(&L[sp], &c, t, S, n, 0, 0, sp);
        // every flat element held by exactly one layout rank (padding aside), under both layouts
        for (int sp = 0; sp < 2; sp++) {
            std::vector<int> held(total, 0);
            for (int r = 0; r < S; r++)
                for (int u = 0; u < L[sp].n_units; u++)
                    zero_unit_pieces(&L[sp], u, r, [&](size_t lo, size_t hi, size_t) { for (size_t i = lo; i < hi; i++) held[i]++; });
            CHECK(std::count(held.begin(), held.end(), 1) == (long)total);
        }
        // which layout ranks hold an EP rank's experts: packed o, o + n, ...; spread o Q .. o Q + Q - 1 (piece r % Q)
        for (int r = 0; r < S; r++) {
            CHECK(ep_layout_rank(r, n, Q, 0) == r % n);
            CHECK(ep_layout_rank(r, n, Q, 1) == r / Q);
            for (const ShardRun& run : L[1].runs[dbrx_experts_unit(0)]) {
                CHECK(shard_run_held(run, r) == (r / Q == run.owner));
                if (shard_run_held(run, r)) CHECK(shard_run_piece(run, r) == r % Q);
            }
        }
        // packed -> spread and back: each rank's shard filled with its flat indices arrives as the other layout's
        for (int from = 0; from < 2; from++) {
            const Zero &A = L[from], &B = L[1 - from];
            std::vector<std::vector<real>> src(S, std::vector<real>(A.shard_total, -1)), dst(S, std::vector<real>(B.shard_total, -1));
            for (int r = 0; r < S; r++)
                for (int u = 0; u < A.n_units; u++)
                    zero_unit_pieces(&A, u, r, [&](size_t lo, size_t hi, size_t at) {
                        for (size_t i = lo; i < hi; i++) src[r][A.shard_off[u] + at + (i - lo)] = (real)(i % 65521);
                    });
            for (int rt = 0; rt < S; rt++)
                for (int rf = 0; rf < S; rf++) zero_copy_pieces(&A, rf, src[rf].data(), &B, rt, dst[rt].data());
            bool ok = true;
            for (int r = 0; r < S; r++)
                for (int u = 0; u < B.n_units; u++)
                    zero_unit_pieces(&B, u, r, [&](size_t lo, size_t hi, size_t at) {
                        for (size_t i = lo; i < hi; i++) ok = ok && dst[r][B.shard_off[u] + at + (i - lo)] == (real)(i % 65521);
                    });
            CHECK(ok);
        }
    }
}

// Writes a checkpoint of master/m/v = pattern(flat index) under layout `runs` for S_old shard ranks, as
// format `version` (2: the units' sizes, whole units; 3: the runs): what an older build (2) or another
// topology (3) leaves on disk. Under g_optimizer_lion (--optimizer lion) master and m alone.
static size_t g_poison = (size_t)-1;   // an element written as NaN (in AdamW v)
static float pattern(size_t i, int a) {
    if (i == g_poison && a == 2) return NAN;
    return a == 0 ? (float)(i % 1000003) : a == 1 ? -(float)(i % 999983) : (float)(i % 7919) + 0.5f;
}
static void write_layout_checkpoint(const std::string& dir, const DbrxConfig* c, const std::vector<std::vector<RunSpec>>& runs, int S_old,
                                    int version, int ep = 1) {
    Zero old;
    zero_layout_from_runs(&old, runs, S_old, ep);
    old.W = S_old; old.R = 1;
    old.fp8_cfg = NULL;
    REQUIRE(mkdir_p(dir).empty());
    std::string files;
    for (int f = 0; f < S_old; f++) {
        const int arrays = 1 + optimizer_moments();
        std::vector<float> data(arrays * old.shard_total, 0.0f);
        for (int u = 0; u < old.n_units; u++)
            shard_run_pieces(old.runs[u], f, [&](size_t lo, size_t hi, size_t at) {
                for (size_t i = lo; i < hi; i++)
                    for (int a = 0; a < arrays; a++) data[a * old.shard_total + old.shard_off[u] + at + (i - lo)] = pattern(i, a);
            });
        char h[CKPT_HEADER_BYTES];
        ckpt_header(h, f, S_old, old.n_units, old.shard_total, 7);
        std::string bytes(h, sizeof h);
        bytes.append((const char*)data.data(), data.size() * sizeof(float));
        REQUIRE(write_file_atomic(dir + "/" + ckpt_shard_name(f), bytes).empty());
        char b[256];
        snprintf(b, sizeof b, "    {\"name\": \"%s\", \"shard_rank\": %d, \"bytes\": %zu, \"crc32c\": \"%08x\"}%s\n", ckpt_shard_name(f).c_str(), f,
                 bytes.size(), crc32c_update(0, bytes.data(), bytes.size()), f + 1 < S_old ? "," : "");
        files += b;
    }
    TrainProgress prog;
    prog.step = 7; prog.tokens = 700; prog.loader = "{}";
    RunInfo run = {10, 1, 1, 1, 8, 1, 1e-3f, 0.0f, AdamWConfig{}};
    std::string m = ckpt_manifest_head(&old, c, &prog, &run);
    if (version < 3) {   // an older build's manifest: no runs
        size_t a = m.find(", \"unit_runs\""), b = m.find("]]", a);
        REQUIRE(a != std::string::npos); REQUIRE(b != std::string::npos);
        m.erase(a, b + 2 - a);
        size_t v = m.find("\"format_version\": 3");
        REQUIRE(v != std::string::npos);
        m.replace(v, 19, "\"format_version\": " + std::to_string(version));
    }
    m += "  \"files\": [\n" + files + "  ],\n  \"manifest_crc32c\": \"00000000\"\n}\n";
    char crc[16];
    snprintf(crc, sizeof crc, "%08x", crc32c_update(0, m.data(), m.size()));
    m.replace(m.rfind("00000000"), 8, crc);
    REQUIRE(write_file_atomic(dir + "/manifest.json", m).empty());
}

TEST_CASE("checkpoints load under any layout: format 2 (whole units, before the experts were units) and 3 (runs); "
          "a wrong layout or a NaN is refused") {
    int argc = 1;
    char name[] = "test_checkpoint";
    char* args[] = {name, NULL};
    char** argv = args;
    Comm comm = comm_init(&argc, &argv);
    DbrxConfig c;
    model_preset_lookup("dbrx-tiny", &c);
    c.n_layers = 2;
    std::vector<ParamInfo> t = dbrx_param_table(&c);
    size_t n = t.back().offset + t.back().numel;
    // the layout before this format: L + 2 units (a block with its experts), each one run
    std::vector<std::vector<RunSpec>> legacy(c.n_layers + 2);
    for (const ParamInfo& p : t) {
        int u = p.unit == 0 ? 0 : p.unit == dbrx_head_unit(&c) ? c.n_layers + 1 : 1 + dbrx_unit_layer(p.unit, &c);
        if (legacy[u].empty()) legacy[u].push_back(RunSpec{p.offset, 0, -1});
        legacy[u][0].numel += p.numel;
    }
    char tmpl[] = "/tmp/test_checkpoint_layout.XXXXXX";
    REQUIRE(mkdtemp(tmpl) != NULL);
    std::string root = tmpl;
    struct { const char* what; std::vector<std::vector<RunSpec>> runs; int S, version, ep; } cases[] = {
        {"format 2, whole units, S 3", legacy, 3, 2, 1},
        {"format 3, the experts in runs, S 4", zero_unit_runs(&c, t, 4), 4, 3, 1},
        {"format 3, S 3 (the experts one padded run)", zero_unit_runs(&c, t, 3), 3, 3, 1},
        {"format 3, expert parallel 2 over S 4 (each EP rank's experts over 2 ranks)", zero_unit_runs(&c, t, 4, 2), 4, 3, 2},
        {"format 3, expert parallel 4 over S 4", zero_unit_runs(&c, t, 4, 4), 4, 3, 4},
    };
    for (auto& k : cases) {
        CAPTURE(k.what);
        std::string dir = root + "/" + std::to_string(k.S) + "_" + std::to_string(k.version) + "_" + std::to_string(k.runs.size()) + "_" +
                          std::to_string(k.ep);
        write_layout_checkpoint(dir, &c, k.runs, k.S, k.version, k.ep);
        Zero z;
        zero_init_layout(&z, &c, t, &comm, 1, 0);   // this process: the whole model, today's units
        z.master = (real*)mallocCheck(z.shard_total * sizeof(real));
        z.m = (real*)mallocCheck(z.shard_total * sizeof(real));
        z.v = (real*)mallocCheck(z.shard_total * sizeof(real));
        TrainProgress prog;
        JsonValue man;
        std::string err = ckpt_try_load(dir, &z, &c, &prog, &man, &comm);
        CHECK(err == "");
        CHECK(prog.step == 7);
        size_t wrong = 0;
        for (size_t i = 0; i < n; i++)   // S = 1: the shard is the flat buffer
            wrong += z.master[i] != pattern(i, 0) || z.m[i] != pattern(i, 1) || z.v[i] != pattern(i, 2);
        CHECK(wrong == 0);
        free(z.master); free(z.m); free(z.v);
        comm_group_free(&z.shard); comm_group_free(&z.replica);
    }
    // a layout that does not hold the model's parameters is refused, naming both counts
    std::vector<std::vector<RunSpec>> short_runs = legacy;
    short_runs[1][0].numel -= 1;
    write_layout_checkpoint(root + "/bad", &c, short_runs, 2, 2);
    Zero z;
    zero_init_layout(&z, &c, t, &comm, 1, 0);
    z.master = (real*)mallocCheck(z.shard_total * sizeof(real));
    z.m = (real*)mallocCheck(z.shard_total * sizeof(real));
    z.v = (real*)mallocCheck(z.shard_total * sizeof(real));
    TrainProgress prog;
    JsonValue man;
    std::string err = ckpt_try_load(root + "/bad", &z, &c, &prog, &man, &comm);
    CHECK(err.find("the units hold " + std::to_string(n - 1) + " parameters, the model " + std::to_string(n)) != std::string::npos);
    // a NaN in the moments, with valid checksums: damage, refused (the loader falls back to an older one)
    g_poison = n / 2;
    write_layout_checkpoint(root + "/nan", &c, zero_unit_runs(&c, t, 2), 2, 3);
    g_poison = (size_t)-1;
    err = ckpt_try_load(root + "/nan", &z, &c, &prog, &man, &comm);
    CHECK(err == "non-finite values in the weights or the optimizer's moments");
    // --optimizer lion: its checkpoints hold master and m (topology.arrays, optimizer.kind "lion"), resharded as AdamW's
    // (S 3 -> 1); an AdamW run's weights-only load (--generate, --eval-only) takes their master alone, m and v left zero
    g_optimizer_lion = 1;
    write_layout_checkpoint(root + "/lion", &c, zero_unit_runs(&c, t, 3), 3, 3);
    std::string lman;
    REQUIRE(read_file(root + "/lion/manifest.json", &lman).empty());
    CHECK(lman.find("\"kind\": \"lion\"") != std::string::npos);
    CHECK(lman.find("\"arrays\": [\"master\", \"lion_m\"]") != std::string::npos);
    free(z.v);
    z.v = NULL;   // (a Lion run has none)
    err = ckpt_try_load(root + "/lion", &z, &c, &prog, &man, &comm);
    CHECK(err == "");
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) wrong += z.master[i] != pattern(i, 0) || z.m[i] != pattern(i, 1);
    CHECK(wrong == 0);
    g_optimizer_lion = 0;
    z.v = (real*)mallocCheck(z.shard_total * sizeof(real));
    for (size_t i = 0; i < z.shard_total; i++) z.m[i] = z.v[i] = 1.0f;
    err = ckpt_try_load(root + "/lion", &z, &c, &prog, &man, &comm, true);
    CHECK(err == "");
    wrong = 0;
    for (size_t i = 0; i < n; i++) wrong += z.master[i] != pattern(i, 0) || z.m[i] != 0.0f || z.v[i] != 0.0f;
    CHECK(wrong == 0);
    free(z.master); free(z.m); free(z.v);
    comm_group_free(&z.shard); comm_group_free(&z.replica);
    rm_rf(root);
    comm_finalize();
}
