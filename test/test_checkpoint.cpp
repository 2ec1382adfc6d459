/*
 * test_checkpoint.cpp — unit tests of the checkpoint building blocks: CRC-32C against its published
 * check value (hardware and table paths), the JSON reader on good and malformed input, shortest float
 * formatting, bf16/f16 conversions against their bit patterns, the safetensors export layout, the
 * config comparison, and that a rank's shard of the initialisation drawn alone equals the same range
 * of the whole model's.
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
