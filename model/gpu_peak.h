/*
 * gpu_peak.h — the dense BF16 tensor-core peak of one GPU, the denominator of MFU (train_cuda.cuh) and
 * of the dev/cuda benchmarks' roofline. Pure host code over what the device says about itself (its
 * name, SM count and max clock), tested on the CPU against NVIDIA's published numbers
 * (test/test_gpu_select.cpp).
 *
 * NVIDIA publishes one number per product, dense = half the "with sparsity" figure of the datasheets:
 * H100 SXM 989.4, H100 PCIe 756, H100 NVL 835, H200 (SXM) 989.4, H200 NVL 835, A100 312 TFLOP/s. Each is
 * SMs x FLOP per clock per SM (Hopper 4096: 1024 BF16 FMA; Ampere 2048) x the clock the datasheet
 * assumes: 989.4e12 / (132 x 4096) = 1830 MHz on the H100 SXM, below its 1980 MHz max clock, so the
 * device's max clock alone would overstate the peak by 8%. The peak is therefore the product's number
 * scaled to this device's SMs (a MIG slice has fewer), and lowered further only if the device's max
 * clock is below the datasheet's. A GPU not in the table: 0 (no MFU) and a hint to pass --peak-tflops.
 * The product is found by name: the PCIe and NVL boards' names say so ("NVIDIA H100 PCIe",
 * "NVIDIA H100 NVL"), the SXM boards' do not ("NVIDIA H100 80GB HBM3", "NVIDIA H200").
 */
#pragma once
#include <cstdio>
#include <cstring>
#include <string>

typedef struct {
    const char* token, *token2;   // both must occur in the device name (token2 NULL: only token)
    const char* product;
    double tflops;                // NVIDIA's dense BF16 number for the whole product
    int sms;                      // the product's SM count
    int flop_per_clock_sm;        // dense BF16 FLOP per clock per SM
} GpuPeakEntry;

// first match wins: the specific boards before the family name
static const GpuPeakEntry GPU_PEAK_TABLE[] = {
    {"H100", "NVL", "H100 NVL", 835.0, 132, 4096},
    {"H100", "PCIe", "H100 PCIe", 756.0, 114, 4096},
    {"H100", NULL, "H100 SXM", 989.4, 132, 4096},
    {"H200", "NVL", "H200 NVL", 835.0, 132, 4096},
    {"GH200", NULL, "GH200", 989.4, 132, 4096},
    {"H200", NULL, "H200 SXM", 989.4, 132, 4096},
    {"H800", "PCIe", "H800 PCIe", 756.0, 114, 4096},
    {"H800", NULL, "H800 SXM", 989.4, 132, 4096},
    {"A100", NULL, "A100", 312.0, 108, 2048},
};

// token occurs in name as a whole model number: "A100" in "NVIDIA A100-SXM4-80GB", not in "NVIDIA RTX A1000"
static inline bool gpu_name_has(const char* name, const char* token) {
    size_t n = strlen(token);
    for (const char* p = strstr(name, token); p; p = strstr(p + 1, token)) {
        char c = p[n];
        if (!((c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'))) return true;
    }
    return false;
}

// FLOP/s (0: unknown); *how says how it was derived. name: cudaDeviceProp.name; sms: its
// multiProcessorCount; clock_khz: cudaDevAttrClockRate (0: unknown)
static inline double gpu_peak_bf16_dense(const char* name, int sms, int clock_khz, std::string* how) {
    char buf[320];
    for (const GpuPeakEntry& e : GPU_PEAK_TABLE) {
        if (!gpu_name_has(name, e.token) || (e.token2 && !gpu_name_has(name, e.token2))) continue;
        double mhz = e.tflops * 1e12 / ((double)e.sms * e.flop_per_clock_sm) / 1e6;   // the datasheet's clock
        int n = sms > 0 && sms < e.sms ? sms : e.sms;                                  // a MIG slice: its SMs
        double use_mhz = clock_khz > 0 && clock_khz / 1e3 < mhz ? clock_khz / 1e3 : mhz;
        double peak = (double)n * e.flop_per_clock_sm * use_mhz * 1e6;
        snprintf(buf, sizeof buf, "%s dense BF16 (NVIDIA: %.1f TFLOP/s = %d SMs x %d FLOP/clock x %.0f MHz): %d SMs x %.0f MHz%s",
                 e.product, e.tflops, e.sms, e.flop_per_clock_sm, mhz, n, use_mhz,
                 use_mhz < mhz ? " (the device's max clock)" : n < e.sms ? " (a part of the GPU, e.g. a MIG slice)" : "");
        *how = buf;
        return peak;
    }
    snprintf(buf, sizeof buf, "unknown GPU \"%s\": pass --peak-tflops", name);
    *how = buf;
    return 0.0;
}
