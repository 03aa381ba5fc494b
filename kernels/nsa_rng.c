/* nsa_rng.c - xoshiro256** with splitmix64 seeding and normal draws. */
#include "nsa_rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void nsaRngSeed(NsaRng *rng, uint64_t seed, uint64_t stream) {
    /* Mixing the stream through splitmix64 first keeps (seed, stream) and
     * (seed + 1, stream - 1) far apart. */
    uint64_t mix = stream;
    uint64_t x = seed ^ splitmix64(&mix);
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&x);
    rng->has_spare = 0;
    rng->spare = 0.0;
}

uint64_t nsaRngNext(NsaRng *rng) {
    uint64_t *s = rng->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double nsaRngUniform(NsaRng *rng) {
    return (double)(nsaRngNext(rng) >> 11) * 0x1.0p-53;
}

uint32_t nsaRngBelow(NsaRng *rng, uint32_t n) {
    if (n == 0) return 0;
    /* Rejection on the top of the 64-bit range removes modulo bias. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t r;
    do r = nsaRngNext(rng);
    while (r >= limit);
    return (uint32_t)(r % n);
}

double nsaRngNormal(NsaRng *rng) {
    if (rng->has_spare) {
        rng->has_spare = 0;
        return rng->spare;
    }
    /* 1 - U lies in (0, 1], so the log is finite. */
    double u1 = 1.0 - nsaRngUniform(rng);
    double u2 = nsaRngUniform(rng);
    double radius = sqrt(-2.0 * log(u1));
    double angle = 2.0 * M_PI * u2;
    rng->spare = radius * sin(angle);
    rng->has_spare = 1;
    return radius * cos(angle);
}
