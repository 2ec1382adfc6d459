/*
 * bench_loader.cpp — data loader throughput from the page cache: tokens per second that
 * dataloader_next delivers (inputs and targets of B x T) in the training order (seeded
 * permutations), single-threaded, as one rank.
 *
 *   dev/data/bench_loader [--data SPEC] [--batch B] [--seq T] [--seconds S] [--world W]
 *   dev/data/bench_loader --synthetic DIR SHARDS TOKENS    writes SHARDS uint32 shards of TOKENS random tokens
 * Every shard is read once before timing, so that the files are in the page cache.
 */
#include <string>
#include "../../data/dataloader.h"

int main(int argc, char** argv) {
    std::string data = "data/sotu/sotu_train_*.bin";
    int B = 8, T = 256, world = 1;
    double seconds = 3;
    for (int i = 1; i < argc; i++) {
        std::string f = argv[i];
        if (f == "--synthetic" && i + 3 < argc) {
            std::string dir = argv[i + 1];
            int shards = atoi(argv[i + 2]);
            int64_t n = atoll(argv[i + 3]);
            std::vector<uint32_t> t((size_t)n);
            Rng rng = {1};
            for (int s = 0; s < shards; s++) {
                for (int64_t k = 0; k < n; k++) t[(size_t)k] = (uint32_t)(rng_u64(&rng) % 100352);
                char path[4096];
                snprintf(path, sizeof path, "%s/synthetic_%06d.bin", dir.c_str(), s);
                shard_write(path, t.data(), n, 2);
            }
            printf("wrote %d shards of %lld uint32 tokens to %s/synthetic_*.bin\n", shards, (long long)n, dir.c_str());
            return 0;
        }
        if (i + 1 >= argc) fail(EXIT_BAD_INPUT, "%s needs a value", f.c_str());
        const char* v = argv[++i];
        if (f == "--data") data = v;
        else if (f == "--batch") B = atoi(v);
        else if (f == "--seq") T = atoi(v);
        else if (f == "--world") world = atoi(v);
        else if (f == "--seconds") seconds = atof(v);
        else fail(EXIT_BAD_INPUT, "unknown flag %s", f.c_str());
    }
    if (B <= 0 || T <= 0 || world <= 0 || !(seconds > 0)) fail(EXIT_BAD_INPUT, "--batch, --seq, --world and --seconds must be positive");
    DataLoader dl;
    DataLoaderOptions opt = {1337, 1, 1, NULL};
    dataloader_init(&dl, data.c_str(), "--data", B, T, 0, world, 1 << 30, &opt);
    uint64_t warm = 0;
    int64_t bytes = 0;
    for (const DataSource& s : dl.sources)
        for (const Shard& sh : s.shards) {
            for (size_t k = 0; k < sh.map_bytes; k += 4096) warm += ((const uint8_t*)sh.map)[k];
            bytes += (int64_t)sh.map_bytes;
        }
    printf("%s", dataloader_describe(&dl, "--data").c_str());
    int64_t batches = 0, sum = 0;
    double t0 = now_seconds(), dt = 0;
    while ((dt = now_seconds() - t0) < seconds) {
        for (int k = 0; k < 16; k++) {
            dataloader_next(&dl);
            sum += dl.inputs[0] + dl.targets[(size_t)B * T - 1];
            batches++;
        }
    }
    double tok_s = (double)batches * B * T / dt;
    printf("loader: batch %d x seq %d (rank 0 of %d): %lld batches in %.2f s = %.3g tokens/s (%.3g GB/s of inputs+targets as int32) "
           "[%.0f MB mapped, checksum %lld]\n", B, T, world, (long long)batches, dt, tok_s, tok_s * 8 / 1e9, bytes / 1e6,
           (long long)(sum + (int64_t)(warm & 1)));
    dataloader_free(&dl);
    return 0;
}
