/* auth.h - the bearer token that guards nsad's TCP listener.
 *
 * The token is 32 random bytes written as 64 lowercase hex characters to a
 * file of mode 0600 (by default <state-dir>/token), created on first start
 * and reused afterwards. Requests prove they know it with
 * "Authorization: Bearer <token>", compared in constant time. */
#ifndef NSAD_AUTH_H
#define NSAD_AUTH_H

#include <stddef.h>
#include "nsa.h"

#define AUTH_TOKEN_HEX 64
#define AUTH_TOKEN_MAX 256

/* Reads the token from path, creating the file with a fresh random token
 * (mode 0600, written to a temp name and renamed) when it does not exist.
 * Refuses a file that group or others can read or write, an empty file and
 * a token with characters outside [A-Za-z0-9._~+/=-]. Fills token (NUL-
 * terminated, at most AUTH_TOKEN_MAX-1 characters); *created is set to 1 when
 * this call made the file (created may be NULL). Returns 0, or -1 with err
 * naming the file and the reason. */
int authLoadOrCreateToken(const char *path, char *token, size_t cap, int *created, NsaError *err);

/* Compares given[0..given_len) with the NUL-terminated token in time that
 * depends only on the lengths. Returns 1 when equal, 0 otherwise (also when
 * either is empty). */
int authTokenEqual(const char *given, size_t given_len, const char *token);

/* Checks an Authorization header value against the token: "Bearer <token>"
 * (the scheme is case-insensitive, surrounding spaces are ignored). header may
 * be NULL. Returns 1 when it proves the token, 0 otherwise. */
int authCheckBearer(const char *header, const char *token);

#endif
