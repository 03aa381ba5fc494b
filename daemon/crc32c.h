/* crc32c.h - CRC-32C (Castagnoli), the checksum of checkpoint manifests.
 *
 * CRC-32C is what ext4, Btrfs and iSCSI use against bit rot: every burst
 * error up to 32 bits and every odd number of flipped bits is caught, and
 * x86-64's SSE4.2 computes it in hardware (several GB/s), so checking a
 * gigabyte-sized checkpoint costs a fraction of a second. It guards
 * against damage, not against someone who can rewrite the manifest too;
 * that is what the metadata cross-checks in checkpoint.c are for. */
#ifndef NSAD_CRC32C_H
#define NSAD_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC-32C of data appended to a string whose CRC-32C is crc (0 for the
 * empty string): crc32cUpdate(crc32cUpdate(0, a, n), b, m) is the CRC of
 * a followed by b. crc32cUpdate(0, "123456789", 9) == 0xe3069283. Uses the
 * SSE4.2 instruction when the CPU has it, else crc32cPortable. Thread-safe,
 * cannot fail. */
uint32_t crc32cUpdate(uint32_t crc, const void *data, size_t len);

/* The same in portable C (8 bytes per table lookup round), whatever the
 * CPU: what crc32cUpdate uses without SSE4.2, and its reference in tests. */
uint32_t crc32cPortable(uint32_t crc, const void *data, size_t len);

#endif
