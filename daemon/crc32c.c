/* crc32c.c - see crc32c.h.
 *
 * The polynomial is 0x1EDC6F41, used bit-reflected (0x82F63B78) with an
 * initial value and final xor of all ones. The portable version is
 * "slicing by 8": table[k][b] is the CRC of byte b followed by k zero
 * bytes, so eight table lookups advance the CRC by eight bytes. */
#include "crc32c.h"

#include <pthread.h>
#include <string.h>

#define POLY 0x82f63b78u

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void buildTable(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[0][b] = c;
    }
    for (int k = 1; k < 8; k++)
        for (uint32_t b = 0; b < 256; b++) table[k][b] = (table[k - 1][b] >> 8) ^ table[0][table[k - 1][b] & 0xff];
}

uint32_t crc32cPortable(uint32_t crc, const void *data, size_t len) {
    pthread_once(&table_once, buildTable);
    const unsigned char *p = data;
    uint32_t c = ~crc;
    while (len >= 8) {
        uint64_t word;
        memcpy(&word, p, 8); /* little-endian hosts only: nsad writes LE files anyway */
        uint32_t lo = (uint32_t)word ^ c, hi = (uint32_t)(word >> 32);
        c = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^ table[4][lo >> 24] ^
            table[3][hi & 0xff] ^ table[2][(hi >> 8) & 0xff] ^ table[1][(hi >> 16) & 0xff] ^ table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--) c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
    return ~c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t crc32cSse42(uint32_t crc, const void *data, size_t len) {
    const unsigned char *p = data;
    uint64_t c = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
        len--;
    }
    while (len >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = __builtin_ia32_crc32di(c, word);
        p += 8;
        len -= 8;
    }
    while (len--) c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return ~(uint32_t)c;
}

uint32_t crc32cUpdate(uint32_t crc, const void *data, size_t len) {
    /* __builtin_cpu_supports reads what the loader already probed: cheap */
    if (__builtin_cpu_supports("sse4.2")) return crc32cSse42(crc, data, len);
    return crc32cPortable(crc, data, len);
}
#else
uint32_t crc32cUpdate(uint32_t crc, const void *data, size_t len) { return crc32cPortable(crc, data, len); }
#endif
