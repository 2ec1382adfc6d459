/*
 * json.h — a small strict JSON reader for what the checkpoints read back: manifests, Hugging Face
 * config.json and safetensors headers (which may come from anywhere, so nesting depth is bounded and
 * every error is reported, never crashed on). Numbers keep their text, so that 64-bit integers and
 * floats round-trip exactly; every value remembers its span in the source (the data loader's state is
 * handed on as raw text). Plus json_quote for writing strings.
 */
#pragma once
#include <string>
#include <vector>
#include "../model/common.h"

typedef struct JsonValue {
    enum Kind { NUL, BOOL, NUM, STR, ARR, OBJ } kind = NUL;
    bool b = false;
    std::string text;                 // NUM: the number as written; STR: the decoded string
    std::vector<std::string> keys;    // OBJ: keys, in order (values in items)
    std::vector<JsonValue> items;     // ARR: elements; OBJ: values
    size_t begin = 0, end = 0;        // the value's span in the source text
} JsonValue;

typedef struct { const char* s; size_t n, i; std::string err; } JsonReader;

static inline void json_ws(JsonReader* r) {
    while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r')) r->i++;
}
static inline bool json_error(JsonReader* r, const char* what) {
    if (r->err.empty()) { char b[160]; snprintf(b, sizeof b, "%s at byte %zu", what, r->i); r->err = b; }
    return false;
}

static inline bool json_value(JsonReader* r, JsonValue* v, int depth);

static inline bool json_string(JsonReader* r, std::string* out) {
    if (r->i >= r->n || r->s[r->i] != '"') return json_error(r, "expected a string");
    r->i++;
    out->clear();
    while (r->i < r->n) {
        unsigned char c = (unsigned char)r->s[r->i++];
        if (c == '"') return true;
        if (c < 0x20) return json_error(r, "control character in a string");
        if (c != '\\') { out->push_back((char)c); continue; }
        if (r->i >= r->n) break;
        char e = r->s[r->i++];
        switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
            if (r->i + 4 > r->n) return json_error(r, "truncated \\u escape");
            unsigned cp = 0;
            for (int k = 0; k < 4; k++) {
                char h = r->s[r->i++];
                cp <<= 4;
                if (h >= '0' && h <= '9') cp |= (unsigned)(h - '0');
                else if (h >= 'a' && h <= 'f') cp |= (unsigned)(h - 'a' + 10);
                else if (h >= 'A' && h <= 'F') cp |= (unsigned)(h - 'A' + 10);
                else return json_error(r, "bad \\u escape");
            }
            // UTF-8 of the code point (surrogate pairs are kept as two 3-byte sequences: names here are ASCII)
            if (cp < 0x80) out->push_back((char)cp);
            else if (cp < 0x800) { out->push_back((char)(0xC0 | (cp >> 6))); out->push_back((char)(0x80 | (cp & 0x3F))); }
            else { out->push_back((char)(0xE0 | (cp >> 12))); out->push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
                   out->push_back((char)(0x80 | (cp & 0x3F))); }
            break;
        }
        default: return json_error(r, "bad escape in a string");
        }
    }
    return json_error(r, "unterminated string");
}

static inline bool json_value(JsonReader* r, JsonValue* v, int depth) {
    if (depth > 64) return json_error(r, "nesting deeper than 64");
    json_ws(r);
    if (r->i >= r->n) return json_error(r, "unexpected end");
    v->begin = r->i;
    char c = r->s[r->i];
    if (c == '{' || c == '[') {
        bool obj = c == '{';
        v->kind = obj ? JsonValue::OBJ : JsonValue::ARR;
        r->i++;
        json_ws(r);
        if (r->i < r->n && r->s[r->i] == (obj ? '}' : ']')) { r->i++; v->end = r->i; return true; }
        for (;;) {
            json_ws(r);
            if (obj) {
                std::string key;
                if (!json_string(r, &key)) return false;
                json_ws(r);
                if (r->i >= r->n || r->s[r->i] != ':') return json_error(r, "expected ':'");
                r->i++;
                v->keys.push_back(key);
            }
            v->items.emplace_back();
            if (!json_value(r, &v->items.back(), depth + 1)) return false;
            json_ws(r);
            if (r->i >= r->n) return json_error(r, "unexpected end");
            if (r->s[r->i] == ',') { r->i++; continue; }
            if (r->s[r->i] == (obj ? '}' : ']')) { r->i++; v->end = r->i; return true; }
            return json_error(r, obj ? "expected ',' or '}'" : "expected ',' or ']'");
        }
    }
    if (c == '"') { v->kind = JsonValue::STR; bool ok = json_string(r, &v->text); v->end = r->i; return ok; }
    if (r->n - r->i >= 4 && !strncmp(r->s + r->i, "true", 4)) { v->kind = JsonValue::BOOL; v->b = true; r->i += 4; v->end = r->i; return true; }
    if (r->n - r->i >= 5 && !strncmp(r->s + r->i, "false", 5)) { v->kind = JsonValue::BOOL; r->i += 5; v->end = r->i; return true; }
    if (r->n - r->i >= 4 && !strncmp(r->s + r->i, "null", 4)) { v->kind = JsonValue::NUL; r->i += 4; v->end = r->i; return true; }
    if (c == '-' || (c >= '0' && c <= '9')) {
        size_t j = r->i;
        while (j < r->n && r->s[j] && strchr("+-0123456789.eE", r->s[j])) j++;
        v->kind = JsonValue::NUM;
        v->text.assign(r->s + r->i, j - r->i);
        r->i = j;
        v->end = j;
        return true;
    }
    return json_error(r, "unexpected character");
}

// parses the whole of s[0, n): returns 1, or 0 with *err set
static inline int json_parse(const char* s, size_t n, JsonValue* out, std::string* err) {
    JsonReader r = {s, n, 0, ""};
    *out = JsonValue();
    if (!json_value(&r, out, 0)) { *err = r.err; return 0; }
    json_ws(&r);
    if (r.i != n) { *err = "trailing characters at byte " + std::to_string(r.i); return 0; }
    return 1;
}

// member `key` of an object, or NULL
static inline const JsonValue* json_get(const JsonValue* v, const char* key) {
    if (!v || v->kind != JsonValue::OBJ) return NULL;
    for (size_t i = 0; i < v->keys.size(); i++) if (v->keys[i] == key) return &v->items[i];
    return NULL;
}

static inline bool json_u64(const JsonValue* v, uint64_t* out) {
    if (!v || v->kind != JsonValue::NUM || v->text.empty() || v->text[0] == '-') return false;
    char* end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v->text.c_str(), &end, 10);
    if (errno || *end) return false;
    *out = x;
    return true;
}
static inline bool json_i64(const JsonValue* v, int64_t* out) {
    if (!v || v->kind != JsonValue::NUM) return false;
    char* end = NULL;
    errno = 0;
    long long x = strtoll(v->text.c_str(), &end, 10);
    if (errno || *end) return false;
    *out = x;
    return true;
}
static inline bool json_int(const JsonValue* v, int* out) {
    int64_t x;
    if (!json_i64(v, &x) || x < -2147483647LL || x > 2147483647LL) return false;
    *out = (int)x;
    return true;
}
static inline bool json_double(const JsonValue* v, double* out) {
    if (!v || v->kind != JsonValue::NUM) return false;
    char* end = NULL;
    errno = 0;
    double x = strtod(v->text.c_str(), &end);
    if (*end) return false;
    *out = x;
    return true;
}

// a value as it reads in a message: the number or string as written, true, false, null; "missing" for none
static inline std::string json_show(const JsonValue* v) {
    if (!v) return "missing";
    switch (v->kind) {
    case JsonValue::NUL: return "null";
    case JsonValue::BOOL: return v->b ? "true" : "false";
    case JsonValue::NUM: return v->text;
    case JsonValue::STR: return "\"" + v->text + "\"";
    default: return v->kind == JsonValue::ARR ? "[...]" : "{...}";
    }
}

// "text" with the characters JSON needs escaped
static inline std::string json_quote(const std::string& s) {
    std::string o = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') { o.push_back('\\'); o.push_back((char)c); }
        else if (c < 0x20) { char b[8]; snprintf(b, sizeof b, "\\u%04x", c); o += b; }
        else o.push_back((char)c);
    }
    return o + "\"";
}

// the shortest decimal that reads back as the same float (0.05, not 0.0500000007)
static inline std::string json_float(float x) {
    char b[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(b, sizeof b, "%.*g", prec, (double)x);
        if ((float)strtod(b, NULL) == x) break;
    }
    return b;
}
