/*
 * test_checkpoint.cpp — unit tests of the checkpoint building blocks: CRC-32C against its published
 * check value (hardware and table paths), the JSON reader on good and malformed input, shortest float
 * formatting, bf16/f16 conversions against their bit patterns, the safetensors export layout, the
 * config comparison, that a rank's shard of the initialisation drawn alone equals the same range
 * of the whole model's, and the FP8 scaling state's round trip through its manifest section
 * (bit-exact, history length and margin changes, malformed sections refused).
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
