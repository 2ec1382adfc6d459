/*
 * test_data.cpp — the shard format and the data loader (doctest):
 *   shards: version 1/2 round trip, llm.c's uint32 format, every header defect, 64-bit offsets
 *   (a sparse shard of more than 2^31 tokens);
 *   order: the keyed permutation is a bijection; every epoch visits every window exactly once, in a
 *   shuffled order that changes with the epoch and the seed; validation reads in file order;
 *   ranks: the global stream is the same with 1, 2 and 4 ranks (plain and mixture + schedule);
 *   resume: stop after k batches, write the state as JSON, restore it in a fresh loader (also with
 *   a different number of ranks), continue: the same tokens as without a stop;
 *   mixtures: each source's share is within 4.5 standard deviations of its weight, before and after
 *   a schedule change;
 *   bad input (in a child process): state of other data, token >= vocab naming its offset,
 *   --data / --data-schedule syntax.
 * Windows are recognised by their content: token i of shard s is s * 1000003 + i, so the first
 * token of a window names its shard and position independently of the loader's code.
 */
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest.h>
#include <sys/wait.h>
#include <map>
#include <set>
#include <functional>
#include "../data/dataloader.h"

static std::string g_dir;

static std::string tmpdir() {
    if (g_dir.empty()) {
        char t[] = "/tmp/test_data_XXXXXX";
        REQUIRE(mkdtemp(t) != NULL);
        g_dir = t;
    }
    return g_dir;
}

// writes shard `name` with n tokens, token i = base + i (uint32: version 2)
static std::string make_shard(const std::string& name, int64_t n, uint32_t base, int version = 0) {
    std::vector<uint32_t> t((size_t)n);
    for (int64_t i = 0; i < n; i++) t[(size_t)i] = base + (uint32_t)i;
    std::string path = tmpdir() + "/" + name;
    shard_write(path.c_str(), t.data(), n, version);
    return path;
}

static const uint32_t SHARD_STRIDE = 1000003;
static const int VOCAB = 1 << 30;

// runs fn in a child process; returns its exit code and stderr
static int run_child(std::function<void()> fn, std::string* err) {
    int pipefd[2];
    REQUIRE(pipe(pipefd) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(pipefd[0]);
        dup2(pipefd[1], 2);
        fn();
        _exit(0);
    }
    close(pipefd[1]);
    err->clear();
    char buf[4096];
    ssize_t n;
    while ((n = read(pipefd[0], buf, sizeof buf)) > 0) err->append(buf, (size_t)n);
    close(pipefd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// the global stream of first tokens of `batches` global batches, read by `world` loaders of B each
static std::vector<int64_t> global_stream(const char* spec, int B, int T, int world, int batches, uint64_t seed,
                                          const char* schedule = NULL, int grad_accum = 1) {
    std::vector<DataLoader> dls((size_t)world);
    DataLoaderOptions opt = {seed, 1, grad_accum, schedule};
    for (int r = 0; r < world; r++) dataloader_init(&dls[(size_t)r], spec, "--data", B, T, r, world, VOCAB, &opt);
    std::vector<int64_t> out;
    for (int b = 0; b < batches; b++)
        for (int r = 0; r < world; r++) {
            dataloader_next(&dls[(size_t)r]);
            for (int i = 0; i < B; i++) out.push_back(dls[(size_t)r].inputs[(size_t)i * T]);
        }
    for (DataLoader& d : dls) dataloader_free(&d);
    return out;
}

TEST_CASE("shards: version 1 and 2 round trip; llm.c's uint32 format") {
    std::string p1 = make_shard("v1.bin", 1000, 60000);          // fits uint16 -> version 1
    std::string p2 = make_shard("v2.bin", 1000, 70000);          // does not -> version 2
    Shard a = shard_open(p1.c_str()), b = shard_open(p2.c_str());
    CHECK(a.info.version == 1);
    CHECK(a.info.bytes_per_token == 2);
    CHECK(a.info.num_tokens == 1000);
    CHECK(a.map_bytes == 1024 + 2000);
    CHECK(b.info.version == 2);
    CHECK(b.info.bytes_per_token == 4);
    CHECK(b.map_bytes == 1024 + 4000);
    CHECK(shard_token_at(a.payload, 2, 999) == 60999);
    CHECK(shard_token_at(b.payload, 4, 999) == 70999);
    const int32_t* h = (const int32_t*)b.map;
    CHECK(h[0] == 20240520);
    CHECK(h[2] == 1000);
    CHECK(h[3] == 4);
    CHECK(h[4] == 0);
    shard_close(&a);
    shard_close(&b);
    // llm.c's llama-3 format: magic 20240801, version 7, uint32 tokens
    std::vector<uint8_t> f(1024 + 40, 0);
    int32_t hdr[3] = {20240801, 7, 10};
    memcpy(f.data(), hdr, sizeof hdr);
    ShardInfo info;
    char err[256];
    CHECK(shard_check(f.data(), (int64_t)f.size(), &info, err, sizeof err) == 1);
    CHECK(info.bytes_per_token == 4);
    CHECK(info.num_tokens == 10);
}

TEST_CASE("shards: every header defect is reported") {
    std::vector<uint8_t> f(1024 + 20, 0);
    auto set = [&](int32_t magic, int32_t version, int32_t count, int32_t bpt, int32_t hi) {
        int32_t h[5] = {magic, version, count, bpt, hi};
        memcpy(f.data(), h, sizeof h);
    };
    ShardInfo info;
    char err[256];
    auto check = [&](int64_t size, const char* want) {
        int ok = shard_check(f.data(), size, &info, err, sizeof err);
        CHECK(ok == 0);
        CHECK_MESSAGE(strstr(err, want) != NULL, err);
    };
    set(20240520, 1, 10, 0, 0);
    CHECK(shard_check(f.data(), 1044, &info, err, sizeof err) == 1);
    check(1000, "truncated");
    check(1043, "header says 10 tokens");
    set(12345, 1, 10, 0, 0); check(1044, "bad magic 12345 at offset 0");
    set(20240520, 3, 10, 0, 0); check(1044, "unsupported version 3 at offset 4");
    set(20240520, 1, 10, 4, 0); check(1044, "offset 12");
    set(20240520, 2, 5, 2, 0); check(1044, "offset 12");
    set(20240520, 1, -5, 0, 0); check(1044, "-5 tokens");
    set(20240801, 1, 5, 0, 0); check(1044, "version 1 at offset 4");
    // version 2 counts in 64 bits: 2^32 + 5 tokens need a file of 1024 + 4 * (2^32 + 5) bytes
    set(20240520, 2, 5, 4, 1);
    CHECK(shard_check(f.data(), 1024 + 4 * ((1ll << 32) + 5), &info, err, sizeof err) == 1);
    CHECK(info.num_tokens == (1ll << 32) + 5);
    check(1024 + 4 * ((1ll << 32) + 4), "header says 4294967301 tokens");
    set(20240520, 2, 0, 4, 0x7fffffff);   // a count whose byte size overflows int64
    check(1 << 20, "header says");
}

TEST_CASE("shards: 64-bit offsets (a sparse shard of 2^31 + 64 tokens)") {
    int64_t n = (1ll << 31) + 64;
    std::string path = tmpdir() + "/sparse.bin";
    FILE* f = fopen(path.c_str(), "wb");
    REQUIRE(f);
    int32_t h[256] = {20240520, 2, (int32_t)(uint32_t)(n & 0xffffffff), 4, (int32_t)(n >> 32)};
    REQUIRE(fwrite(h, sizeof h, 1, f) == 1);
    fclose(f);
    REQUIRE(truncate(path.c_str(), 1024 + 4 * n) == 0);   // sparse: reads as zeros
    int fd = open(path.c_str(), O_WRONLY);
    uint32_t marks[9];
    for (int i = 0; i < 9; i++) marks[i] = 777 + i;
    int64_t at = ((n - 1) / 8 - 1) * 8;                 // the last window of T = 8
    REQUIRE(pwrite(fd, marks, sizeof marks, 1024 + 4 * at) == (ssize_t)sizeof marks);
    close(fd);
    DataLoader dl;
    dataloader_init(&dl, path.c_str(), "--val-data", 1, 8, 0, 1, VOCAB, NULL);   // file order
    DataLoaderState st;
    dataloader_get_state(&dl, &st);
    CHECK(st.source_windows[0] == (n - 1) / 8);
    st.position = st.source_position[0] = (n - 1) / 8 - 1;   // the last window
    dataloader_set_state(&dl, &st, "test");
    dataloader_next(&dl);
    CHECK(dl.inputs[0] == 777);
    CHECK(dl.inputs[7] == 784);
    CHECK(dl.targets[7] == 785);
    dataloader_free(&dl);
    unlink(path.c_str());
}

TEST_CASE("order: the keyed permutation is a bijection of [0, n)") {
    for (int64_t n : {1, 2, 3, 4, 5, 7, 16, 17, 100, 255, 256, 257, 1000, 4097}) {
        std::vector<int> seen((size_t)n, 0);
        for (int64_t i = 0; i < n; i++) {
            int64_t p = data_permute(i, n, 0x1234567 + (uint64_t)n);
            REQUIRE(p >= 0);
            REQUIRE(p < n);
            seen[(size_t)p]++;
        }
        int ok = 1;
        for (int s : seen) ok &= s == 1;
        CHECK_MESSAGE(ok, "n = " << n);
    }
}

TEST_CASE("order: every epoch is a shuffled permutation of all windows; it changes with epoch and seed") {
    // 3 shards, T = 8: 41, 25 and 60 windows
    make_shard("ep_a.bin", 8 * 41 + 5, 0 * SHARD_STRIDE);
    make_shard("ep_b.bin", 8 * 25 + 1, 1 * SHARD_STRIDE);
    make_shard("ep_c.bin", 8 * 60 + 3, 2 * SHARD_STRIDE);
    std::string spec = tmpdir() + "/ep_*.bin";
    const int W = 41 + 25 + 60;
    std::vector<int64_t> s = global_stream(spec.c_str(), 6, 8, 1, (2 * W + 5) / 6, 42);
    std::vector<int64_t> e1(s.begin(), s.begin() + W), e2(s.begin() + W, s.begin() + 2 * W);
    std::set<int64_t> all;
    for (int64_t t = 0; t < 3; t++) {
        int64_t wins[3] = {41, 25, 60};
        for (int64_t w = 0; w < wins[t]; w++) all.insert(t * SHARD_STRIDE + w * 8);
    }
    CHECK(std::set<int64_t>(e1.begin(), e1.end()) == all);
    CHECK(std::set<int64_t>(e2.begin(), e2.end()) == all);
    std::vector<int64_t> sorted = e1;
    std::sort(sorted.begin(), sorted.end());
    CHECK(e1 != sorted);   // shuffled
    CHECK(e1 != e2);       // re-drawn each epoch
    // the shards are whole blocks of an epoch (a permutation of shards, then windows inside each)
    int changes = 0;
    for (int i = 1; i < W; i++) changes += e1[i] / SHARD_STRIDE != e1[i - 1] / SHARD_STRIDE;
    CHECK(changes == 2);
    // the same seed gives the same stream; another seed another one
    CHECK(global_stream(spec.c_str(), 6, 8, 1, 10, 42) == std::vector<int64_t>(s.begin(), s.begin() + 60));
    CHECK(global_stream(spec.c_str(), 6, 8, 1, 10, 43) != std::vector<int64_t>(s.begin(), s.begin() + 60));
}

TEST_CASE("order: validation reads the shards in file order, windows in order, split across ranks") {
    make_shard("va_0.bin", 8 * 5 + 1, 0);
    make_shard("va_1.bin", 8 * 3 + 1, SHARD_STRIDE);
    std::string spec = tmpdir() + "/va_*.bin";
    std::vector<int64_t> want;
    for (int w = 0; w < 5; w++) want.push_back(w * 8);
    for (int w = 0; w < 3; w++) want.push_back(SHARD_STRIDE + w * 8);
    for (int world : {1, 2, 4}) {
        std::vector<DataLoader> dls((size_t)world);
        for (int r = 0; r < world; r++) dataloader_init(&dls[(size_t)r], spec.c_str(), "--val-data", 4 / world, 8, r, world, VOCAB, NULL);
        std::vector<int64_t> got;
        for (int pass = 0; pass < 2; pass++) {   // reset starts over
            got.clear();
            for (int b = 0; b < 2; b++)
                for (int r = 0; r < world; r++) {
                    dataloader_next(&dls[(size_t)r]);
                    for (int i = 0; i < 4 / world; i++) got.push_back(dls[(size_t)r].inputs[(size_t)i * 8]);
                    if (pass == 0 && b == 0 && r == 0) CHECK(dls[0].targets[0] == dls[0].inputs[1]);
                }
            CHECK_MESSAGE(got == want, "world " << world << " pass " << pass);
            for (DataLoader& d : dls) dataloader_reset(&d);
        }
        for (DataLoader& d : dls) dataloader_free(&d);
    }
}

TEST_CASE("ranks: the global stream does not depend on the number of ranks (1, 2, 4)") {
    make_shard("rk_a.bin", 8 * 33 + 1, 0);
    make_shard("rk_b.bin", 8 * 20 + 1, SHARD_STRIDE);
    make_shard("mx_x.bin", 8 * 50 + 1, 5 * SHARD_STRIDE);
    std::string plain = tmpdir() + "/rk_*.bin";
    std::string mix = "a=" + tmpdir() + "/rk_*.bin:0.7,b=" + tmpdir() + "/mx_x.bin:0.3";
    std::vector<int64_t> ref = global_stream(plain.c_str(), 8, 8, 1, 20, 7);
    CHECK(global_stream(plain.c_str(), 4, 8, 2, 20, 7) == ref);
    CHECK(global_stream(plain.c_str(), 2, 8, 4, 20, 7) == ref);
    std::vector<int64_t> mref = global_stream(mix.c_str(), 8, 8, 1, 30, 7, "6:a=0.1,b=0.9", 2);
    CHECK(global_stream(mix.c_str(), 4, 8, 2, 30, 7, "6:a=0.1,b=0.9", 2) == mref);
    CHECK(global_stream(mix.c_str(), 2, 8, 4, 30, 7, "6:a=0.1,b=0.9", 2) == mref);
}

TEST_CASE("resume: the state restores the exact token stream, also with another number of ranks") {
    make_shard("rs_a.bin", 8 * 29 + 1, 0);
    make_shard("rs_b.bin", 8 * 17 + 1, SHARD_STRIDE);
    make_shard("rs_m.bin", 8 * 40 + 1, 7 * SHARD_STRIDE);
    std::string plain = tmpdir() + "/rs_[ab].bin";
    std::string mix = "web=" + tmpdir() + "/rs_[ab].bin:2,code=" + tmpdir() + "/rs_m.bin:1";
    for (int mixture = 0; mixture < 2; mixture++) {
        const char* spec = mixture ? mix.c_str() : plain.c_str();
        const char* sched = mixture ? "9:web=1,code=3" : NULL;
        const int B = 8, T = 8, k = 7, m = 9;   // stop after k batches, then m more; 16 batches cross an epoch
        DataLoaderOptions opt = {99, 1, 1, sched};
        // reference: k + m batches without a stop, whole rows (inputs and targets)
        DataLoader ref;
        dataloader_init(&ref, spec, "--data", B, T, 0, 1, VOCAB, &opt);
        std::vector<int> want_in, want_tg;
        for (int b = 0; b < k + m; b++) {
            dataloader_next(&ref);
            if (b >= k) {
                want_in.insert(want_in.end(), ref.inputs.begin(), ref.inputs.end());
                want_tg.insert(want_tg.end(), ref.targets.begin(), ref.targets.end());
            }
        }
        dataloader_free(&ref);
        // stop after k batches and write the state
        DataLoader first;
        dataloader_init(&first, spec, "--data", B, T, 0, 1, VOCAB, &opt);
        for (int b = 0; b < k; b++) dataloader_next(&first);
        DataLoaderState st;
        dataloader_get_state(&first, &st);
        std::string line = dataloader_state_write(&st);
        dataloader_free(&first);
        CHECK(line.find("\"position\": 56") != std::string::npos);
        for (int world : {1, 2, 4}) {
            DataLoaderOptions other = {12345, 1, 1, sched};   // the seed comes from the state
            std::vector<DataLoader> dls((size_t)world);
            for (int r = 0; r < world; r++) {
                DataLoaderState back;
                std::string err;
                REQUIRE_MESSAGE(dataloader_state_parse(line.c_str(), &back, &err) == 1, err);
                dataloader_init(&dls[(size_t)r], spec, "--data", B / world, T, r, world, VOCAB, &other);
                dataloader_set_state(&dls[(size_t)r], &back, "test");
            }
            std::vector<int> got_in, got_tg;
            for (int b = 0; b < m; b++)
                for (int r = 0; r < world; r++) {
                    dataloader_next(&dls[(size_t)r]);
                    got_in.insert(got_in.end(), dls[(size_t)r].inputs.begin(), dls[(size_t)r].inputs.end());
                    got_tg.insert(got_tg.end(), dls[(size_t)r].targets.begin(), dls[(size_t)r].targets.end());
                }
            CHECK_MESSAGE(got_in == want_in, "mixture " << mixture << " world " << world);
            CHECK_MESSAGE(got_tg == want_tg, "mixture " << mixture << " world " << world);
            for (DataLoader& d : dls) dataloader_free(&d);
        }
    }
}

TEST_CASE("context parallelism: CP rank r of a group gets chunks r and 2n-1-r of its group's sequences; resume exact") {
    make_shard("cp_a.bin", 16 * 37 + 1, 0);
    std::string spec = tmpdir() + "/cp_a.bin";
    const int B = 2, T = 16, world = 4, k = 3, m = 4;
    for (int n : {2, 4}) {
        int groups = world / n, c = T / (2 * n);
        DataLoaderOptions opt = {5, 1, 1, NULL};
        DataLoader ref;   // one rank reading every group's rows: group g's are rows [g B, (g+1) B)
        dataloader_init(&ref, spec.c_str(), "--data", B * groups, T, 0, 1, VOCAB, &opt);
        std::vector<DataLoader> dls((size_t)world);
        for (int r = 0; r < world; r++) {
            dataloader_init(&dls[(size_t)r], spec.c_str(), "--data", B, T, r, world, VOCAB, &opt);
            dataloader_context_parallel(&dls[(size_t)r], n);
        }
        bool ok = true;
        for (int step = 0; step < k + m; step++) {
            if (step == k) {   // resume: every rank from rank 0's state (one global state)
                DataLoaderState st;
                dataloader_get_state(&dls[0], &st);
                for (int r = 0; r < world; r++) {
                    dataloader_free(&dls[(size_t)r]);
                    dataloader_init(&dls[(size_t)r], spec.c_str(), "--data", B, T, r, world, VOCAB, &opt);
                    dataloader_context_parallel(&dls[(size_t)r], n);
                    dataloader_set_state(&dls[(size_t)r], &st, "test");
                }
            }
            dataloader_next(&ref);
            for (int r = 0; r < world; r++) {
                DataLoader* d = &dls[(size_t)r];
                dataloader_next(d);
                int g = r / n, cr = r % n;
                for (int b = 0; b < B; b++)
                    for (int t = 0; t < T / n; t++) {
                        int chunk = t < c ? cr : 2 * n - 1 - cr, pos = chunk * c + t % c;
                        size_t want = (size_t)(g * B + b) * T + pos, got = (size_t)b * (T / n) + t;
                        ok = ok && d->inputs[got] == ref.inputs[want] && d->targets[got] == ref.targets[want];
                    }
            }
        }
        CHECK_MESSAGE(ok, "CP " << n << " of " << world << " ranks");
        dataloader_free(&ref);
        for (DataLoader& d : dls) dataloader_free(&d);
    }
}

TEST_CASE("resume: the state's JSON line round-trips and malformed lines are refused") {
    DataLoaderState st;
    memset(&st, 0, sizeof st);
    st.seed = 18446744073709551615ull;
    st.position = 300;
    st.batches = 10;
    st.num_sources = 2;
    st.source_position[0] = 250; st.source_windows[0] = 100; st.source_epoch[0] = 2;
    st.source_position[1] = 50; st.source_windows[1] = 70; st.source_epoch[1] = 0;
    std::string line = dataloader_state_write(&st);
    CHECK(line == "{\"version\": 1, \"seed\": 18446744073709551615, \"position\": 300, \"batches\": 10, \"sources\": "
                  "[{\"epoch\": 2, \"position\": 250, \"windows\": 100}, {\"epoch\": 0, \"position\": 50, \"windows\": 70}]}");
    DataLoaderState back;
    std::string err;
    REQUIRE(dataloader_state_parse(line.c_str(), &back, &err) == 1);
    CHECK(memcmp(&back, &st, sizeof st) == 0);
    const char* bad[] = {
        "",
        "{}",
        "{\"version\": 2, \"seed\": 1, \"position\": 0, \"batches\": 0, \"sources\": [{\"epoch\": 0, \"position\": 0, \"windows\": 5}]}",
        "{\"version\": 1, \"seed\": 1, \"position\": 3, \"batches\": 0, \"sources\": [{\"epoch\": 0, \"position\": 2, \"windows\": 5}]}",
        "{\"version\": 1, \"seed\": 1, \"position\": 7, \"batches\": 0, \"sources\": [{\"epoch\": 0, \"position\": 7, \"windows\": 5}]}",
        "{\"version\": 1, \"seed\": 1, \"position\": 0, \"batches\": 0, \"sources\": [{\"epoch\": 0, \"position\": 0, \"windows\": 0}]}",
        "{\"version\": 1, \"seed\": 1, \"position\": 0, \"batches\": 0, \"sources\": []}",
        "{\"version\": 1, \"seed\": 1, \"position\": 0, \"batches\": 0, \"sources\": [{\"epoch\": 0, \"position\": 0, \"windows\": 5}]} x",
        "{\"version\": 1, \"seed\": -1, \"position\": 0, \"batches\": 0, \"sources\": [{\"epoch\": 0, \"position\": 0, \"windows\": 5}]}",
        "{\"version\": 1, \"seed\": 1, \"position\": 99999999999999999999, \"batches\": 0, \"sources\": []}",
    };
    for (const char* b : bad) CHECK_MESSAGE(dataloader_state_parse(b, &back, &err) == 0, std::string(b));
}

TEST_CASE("mixtures: each source's share matches its weight within sampling error, also after a schedule change") {
    make_shard("w_0.bin", 8 * 100 + 1, 0);
    make_shard("w_1.bin", 8 * 100 + 1, SHARD_STRIDE);
    make_shard("w_2.bin", 8 * 100 + 1, 2 * SHARD_STRIDE);
    std::string d = tmpdir();
    std::string spec = "web=" + d + "/w_0.bin:6,code=" + d + "/w_1.bin:3,books=" + d + "/w_2.bin:1";
    // 400 global batches of 50 = 20000 sequences before step 400 (grad_accum 2: batch 800), then 20000 after
    std::vector<int64_t> s = global_stream(spec.c_str(), 50, 8, 1, 1600, 5, "400:web=0,code=1,books=3", 2);
    REQUIRE(s.size() == 80000);
    double want[2][3] = {{0.6, 0.3, 0.1}, {0.0, 0.25, 0.75}};
    for (int part = 0; part < 2; part++) {
        int64_t count[3] = {0, 0, 0};
        for (int64_t i = part * 40000; i < (part + 1) * 40000; i++) count[s[(size_t)i] / SHARD_STRIDE]++;
        for (int k = 0; k < 3; k++) {
            double n = 40000, p = want[part][k], share = count[k] / n, sigma = sqrt(p * (1 - p) / n);
            if (p == 0) CHECK(count[k] == 0);
            else CHECK_MESSAGE(fabs(share - p) < 4.5 * sigma, "part " << part << " source " << k << " share " << share << " want " << p);
        }
    }
}

TEST_CASE("bad input: one line naming the problem, exit 2") {
    std::string d = tmpdir();
    make_shard("bad_a.bin", 8 * 10 + 1, 0);
    make_shard("bad_b.bin", 8 * 12 + 1, 0);
    std::vector<uint32_t> t(200, 5);
    t[123] = 9999;
    t[150] = 9999;
    shard_write((d + "/bad_vocab.bin").c_str(), t.data(), 200, 2);
    std::string err;
    struct Case { std::function<void()> fn; const char* want; };
    std::string a = d + "/bad_a.bin", b = d + "/bad_b.bin", v = d + "/bad_vocab.bin";
    std::vector<Case> cases = {
        {[&] {   // a state taken over other data
             DataLoader x, y;
             DataLoaderOptions opt = {1, 1, 1, NULL};
             dataloader_init(&x, a.c_str(), "--data", 2, 8, 0, 1, VOCAB, &opt);
             dataloader_init(&y, b.c_str(), "--data", 2, 8, 0, 1, VOCAB, &opt);
             DataLoaderState st;
             dataloader_get_state(&x, &st);
             dataloader_set_state(&y, &st, "ckpt.bin");
         }, "ckpt.bin: source 1 has 12 sequences"},
        {[&] {   // every token of the shard is checked when read; the message names the first bad one
             DataLoader x;
             dataloader_init(&x, v.c_str(), "--val-data", 24, 8, 0, 1, 1000, NULL);
             dataloader_next(&x);
         }, "bad_vocab.bin: token 9999 at offset 123 (byte 1516) is >= the vocabulary size 1000"},
        {[&] { DataLoader x; dataloader_init(&x, a.c_str(), "--data", 2, 100, 0, 1, VOCAB, NULL); }, "smaller than one sequence"},
        {[&] { DataLoader x; dataloader_init(&x, (d + "/nothing_*.bin").c_str(), "--data", 2, 8, 0, 1, VOCAB, NULL); }, "matches no file"},
        {[&] { DataLoader x; DataLoaderOptions o = {1, 1, 1, NULL};
               dataloader_init(&x, ("w=" + d + "/nothing_*.bin:1,c=" + a + ":1").c_str(), "--data", 2, 8, 0, 1, VOCAB, &o); },
         "--data source 'w' '"},
        {[&] { DataLoader x; dataloader_init(&x, ("w=" + a + ":1,c=" + b + ":1").c_str(), "--val-data", 2, 8, 0, 1, VOCAB, NULL); },
         "validation takes one glob"},
    };
    for (const Case& c : cases) {
        int rc = run_child(c.fn, &err);
        CHECK_MESSAGE(rc == 2, err);
        CHECK_MESSAGE(err.find(c.want) != std::string::npos, err);
        CHECK_MESSAGE(std::count(err.begin(), err.end(), '\n') == 1, err);
    }
}

TEST_CASE("syntax: --data and --data-schedule") {
    std::vector<DataSpecEntry> e;
    std::string err;
    REQUIRE(data_spec_parse("data/x_*.bin", &e, &err) == 1);
    CHECK(e.size() == 1);
    CHECK(e[0].name == "");
    CHECK(e[0].pattern == "data/x_*.bin");
    REQUIRE(data_spec_parse("./a=b/c:d*.bin", &e, &err) == 1);   // a path, not a mixture
    CHECK(e[0].pattern == "./a=b/c:d*.bin");
    REQUIRE(data_spec_parse("w@b=/a:1", &e, &err) == 1);         // not NAME= at the start: a glob
    CHECK(e[0].name == "");
    REQUIRE(data_spec_parse("web=/d/a:b_*.bin:0.7,code-1=/d/c_*.bin:3e-1", &e, &err) == 1);
    REQUIRE(e.size() == 2);
    CHECK(e[0].name == "web");
    CHECK(e[0].pattern == "/d/a:b_*.bin");   // the weight follows the last ':'
    CHECK(e[0].weight == 0.7);
    CHECK(e[1].name == "code-1");
    CHECK(e[1].weight == doctest::Approx(0.3));
    const char* bad[] = {"", "web=/d/a.bin", "web=/d/a.bin:0", "web=/d/a.bin:-1", "web=/d/a.bin:x", "web=/d/a.bin:inf",
                         "web=:1", "web=/a:1,web=/b:1", "web=/a:1,/b:1", "web=/a:1,", "web=/a:1,c=/b:nan"};
    for (const char* b : bad) CHECK_MESSAGE(data_spec_parse(b, &e, &err) == 0, std::string(b));
    REQUIRE(data_spec_parse("web=/a:1,code=/b:1", &e, &err) == 1);
    std::vector<DataStage> st;
    REQUIRE(data_schedule_parse("100:web=0.5,code=0.5;250:code=1,web=0", e, &st, &err) == 1);
    REQUIRE(st.size() == 2);
    CHECK(st[0].step == 100);
    CHECK(st[1].step == 250);
    CHECK(st[1].weight[0] == 0);
    CHECK(st[1].weight[1] == 1);
    const char* bads[] = {"100", "x:web=1,code=1", "0:web=1,code=1", "100:web=1", "100:web=1,code=1,web=1",
                          "100:web=1,code=1,other=1", "100:web=0,code=0", "100:web=-1,code=2", "100:web=1,code=1;50:web=1,code=1",
                          "100:web=1,code=1;", "100:web,code=1"};
    for (const char* b : bads) CHECK_MESSAGE(data_schedule_parse(b, e, &st, &err) == 0, std::string(b));
    std::vector<DataSpecEntry> plain;
    REQUIRE(data_spec_parse("/a_*.bin", &plain, &err) == 1);
    CHECK(data_schedule_parse("100:web=1", plain, &st, &err) == 0);   // a schedule needs a mixture
}
