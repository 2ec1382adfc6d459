/*
 * crc32c.h — CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of every checkpoint
 * file: the SSE4.2 crc32 instruction when the build targets it (-march=native on x86), else a
 * slicing-by-8 table. Both give the same value; crc32c("123456789") = 0xE3069283.
 */
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

static inline const uint32_t* crc32c_table() {
    static uint32_t t[8][256];
    static bool ready = false;
    if (!ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
            t[0][i] = c;
        }
        for (int s = 1; s < 8; s++)
            for (int i = 0; i < 256; i++) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
        ready = true;
    }
    return &t[0][0];
}

// software path (also used by the test that checks both paths agree)
static inline uint32_t crc32c_update_sw(uint32_t crc, const void* data, size_t n) {
    const uint32_t* t = crc32c_table();
    const unsigned char* p = (const unsigned char*)data;
    crc = ~crc;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = t[7 * 256 + (w & 0xFF)] ^ t[6 * 256 + ((w >> 8) & 0xFF)] ^ t[5 * 256 + ((w >> 16) & 0xFF)] ^
              t[4 * 256 + ((w >> 24) & 0xFF)] ^ t[3 * 256 + ((w >> 32) & 0xFF)] ^ t[2 * 256 + ((w >> 40) & 0xFF)] ^
              t[1 * 256 + ((w >> 48) & 0xFF)] ^ t[0 * 256 + (w >> 56)];
        p += 8; n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ t[(crc ^ *p++) & 0xFF];
    return ~crc;
}

// crc of data continuing from `crc` (start with 0)
static inline uint32_t crc32c_update(uint32_t crc, const void* data, size_t n) {
#if defined(__SSE4_2__)
    const unsigned char* p = (const unsigned char*)data;
    uint64_t c = ~crc;
    while (n >= 8) { uint64_t w; memcpy(&w, p, 8); c = _mm_crc32_u64(c, w); p += 8; n -= 8; }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return ~c32;
#else
    return crc32c_update_sw(crc, data, n);
#endif
}
