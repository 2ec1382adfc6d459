/*
 * fuzz_data.cpp — libFuzzer target (clang++ -fsanitize=fuzzer,address,undefined) of every parser of
 * untrusted data input. The first byte picks the parser, the rest is its input:
 *   0: a shard file (header check, then the vocabulary scan over the payload it vouches for)
 *   1: a data loader state line (dataloader_state_parse; a parsed state must write back the same)
 *   2: --data and --data-schedule values (separated by the first newline)
 *   3: text for the cl100k pre-tokenizer (the pieces must tile the input)
 * A crash, a sanitizer report or a failed invariant (abort) is a finding.
 *   make test/fuzz_data && ./test/fuzz_data -max_total_time=20 CORPUS_DIR
 */
#include <string>
#include <vector>
#include "../data/dataloader.h"
#include "../data/tokenizer.h"

#define FUZZ_ASSERT(c) do { if (!(c)) { fprintf(stderr, "invariant failed: %s\n", #c); abort(); } } while (0)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    int mode = data[0] % 4;
    const uint8_t* in = data + 1;
    size_t n = size - 1;
    if (mode == 0) {
        // the real reader hands shard_check the first 1024 bytes of a file of `size` bytes
        std::vector<uint8_t> file(in, in + n);
        ShardInfo info;
        char err[256];
        if (shard_check(file.data(), (int64_t)file.size(), &info, err, sizeof err)) {
            FUZZ_ASSERT(SHARD_HEADER_BYTES + info.num_tokens * info.bytes_per_token == (int64_t)file.size());
            int64_t bad = shard_find_bad_token(file.data() + SHARD_HEADER_BYTES, info.bytes_per_token, 0, info.num_tokens, 1000);
            FUZZ_ASSERT(bad < info.num_tokens);
        } else {
            FUZZ_ASSERT(strlen(err) > 0);
        }
    } else if (mode == 1) {
        std::string text((const char*)in, n);
        DataLoaderState st;
        std::string err;
        if (dataloader_state_parse(text.c_str(), &st, &err)) {
            DataLoaderState again;
            FUZZ_ASSERT(dataloader_state_parse(dataloader_state_write(&st).c_str(), &again, &err) == 1);
            FUZZ_ASSERT(memcmp(&st, &again, sizeof st) == 0);
        }
    } else if (mode == 2) {
        std::string text((const char*)in, n);
        size_t nl = text.find('\n');
        std::string spec = text.substr(0, nl), sched = nl == std::string::npos ? "" : text.substr(nl + 1);
        std::vector<DataSpecEntry> e;
        std::vector<DataStage> st;
        std::string err;
        if (data_spec_parse(spec.c_str(), &e, &err)) {
            FUZZ_ASSERT(!e.empty() && e.size() <= DATA_MAX_SOURCES);
            for (const DataSpecEntry& x : e) FUZZ_ASSERT(x.weight > 0 && !x.pattern.empty());
            if (data_schedule_parse(sched.c_str(), e, &st, &err))
                for (size_t k = 1; k < st.size(); k++) FUZZ_ASSERT(st[k].step > st[k - 1].step);
        }
    } else {
        unicode_init();
        for (size_t i = 0; i < n;) {
            size_t j = cl100k_next_piece(in, n, i);
            FUZZ_ASSERT(j > i && j <= n);
            i = j;
        }
    }
    return 0;
}
