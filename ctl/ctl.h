/* ctl.h - what nsactl's commands share: the connection and output settings,
 * the exit codes, and the one call that turns an HTTP exchange with nsad into
 * either a parsed JSON answer or an error message plus exit code.
 *
 * Every command prints its result on stdout (human text, or with --json the
 * daemon's JSON, one document per line) and its errors as one line on stderr
 * starting with "nsactl: ". */
#ifndef NSACTL_CTL_H
#define NSACTL_CTL_H

#include <cjson/cJSON.h>
#include "http.h"

/* The element count of array a (an array, not a pointer), as an int: the
 * option, column and name counts the commands pass along with an array. */
#define ARRAY_LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Exit codes (documented in `nsactl --help` and docs/NSACTL.md). A non-2xx
 * answer maps to one the same way for every call (ctlCall, ctlStream,
 * ctlDownload): 404 CTL_EXIT_NOT_FOUND, 409 CTL_EXIT_CONFLICT, 400 what the
 * caller says a refused request means (its bad_request_exit; for a config
 * body CTL_EXIT_CONFIG, but only for the codes invalid_config and
 * invalid_json), anything else (401, 500, ...) CTL_EXIT_ERROR. Its message
 * is "nsactl: <daemon's message> (<code>, HTTP <status>)", plus on a 401
 * where the token came from (or that none was found). */
enum {
    CTL_OK = 0,
    CTL_EXIT_ERROR = 1,       /* the daemon answered with an error (or a local failure) */
    CTL_EXIT_USAGE = 2,       /* bad command line */
    CTL_EXIT_UNREACHABLE = 3, /* no daemon at the socket / URL, or no answer in time */
    CTL_EXIT_NOT_FOUND = 4,   /* 404: no such run (or route) */
    CTL_EXIT_CONFLICT = 5,    /* 409: busy, or the run's state forbids it */
    CTL_EXIT_CONFIG = 78      /* the config file is missing, unreadable or rejected */
};

typedef struct Ctl {
    HttpTarget target;
    int json;                 /* --json: machine-readable output */
    int tty;                  /* stdout is a terminal */
    const char *state_dir;    /* where the token file is looked for */
    int state_dir_default;    /* no --state-dir / NSAD_STATE_DIR: the system's is looked at too */
    char state_dir_buf[HTTP_ADDR_MAX];
    char token_source[HTTP_ADDR_MAX]; /* where the token came from, for 401 hints; "" if none */
} Ctl;

/* One answered request. json is the parsed body (NULL when the body is empty
 * or not JSON); body/len the raw text. Free with ctlReplyFree. */
typedef struct CtlReply {
    HttpResponse http;
    cJSON *json;
} CtlReply;

/* Sends the request and checks the answer. Returns CTL_OK with *reply filled
 * when the daemon answered 2xx with JSON; otherwise prints one line on stderr
 * (the daemon's refusal as above, or why it could not reach nsad) and
 * returns the exit code that fits: CTL_EXIT_UNREACHABLE, or the status's
 * (above; a 400 is CTL_EXIT_CONFIG when config_body is set and the code
 * says the config was rejected, else CTL_EXIT_ERROR). reply needs
 * ctlReplyFree after CTL_OK only; after an error reply->http.status still
 * holds the HTTP status (0 when unreachable). */
int ctlCall(const Ctl *ctl, const char *method, const char *path, const char *body,
            size_t body_len, const char *content_type, int config_body, CtlReply *reply);

/* Like ctlCall but prints nothing on error: the caller gets the exit code and
 * the message in msg (for retries in watch). */
int ctlCallQuiet(const Ctl *ctl, const char *method, const char *path, const char *body,
                 size_t body_len, const char *content_type, int config_body, CtlReply *reply,
                 char *msg, size_t msgcap);

/* Frees what a call left in reply (its JSON and HTTP body) and clears it
 * for reuse; the struct itself is the caller's. NULL is a no-op. */
void ctlReplyFree(CtlReply *reply);

/* Sends the request and hands each line of a 2xx answer to on_line as it
 * comes (httpStream, http.h). Returns CTL_OK once a 2xx stream has ended;
 * otherwise prints one line on stderr (as ctlCall) and returns
 * CTL_EXIT_UNREACHABLE or the status's exit code (above; a 400 is
 * bad_request_exit). Whether the stream said all it should is for the
 * caller's on_line to tell. Nothing to free. */
int ctlStream(const Ctl *ctl, const char *method, const char *path, const char *body,
              size_t body_len, HttpLineFn on_line, void *ctx, int bad_request_exit);

/* GETs path into fd (httpDownload, http.h). Returns CTL_OK once a 2xx
 * answer is written whole; otherwise prints one line on stderr as ctlCall
 * does and returns CTL_EXIT_UNREACHABLE (a broken exchange), CTL_EXIT_ERROR
 * (a failed write to fd) or the status's exit code (above; a 400 is
 * CTL_EXIT_ERROR). Nothing to free. */
int ctlDownload(const Ctl *ctl, const char *path, int fd, HttpProgressFn progress, void *ctx);

/* Prints the raw JSON body of a reply on stdout as one line (what --json
 * promises: the daemon's document, unchanged). */
void ctlPrintJson(const CtlReply *reply);

/* Helpers for reading the daemon's JSON; obj may be NULL. Missing keys and
 * JSON null read as "absent".
 * ctlHasNumber is a predicate: it returns 1 with *out set when obj has a
 * number at key, else 0 with *out left alone (so a default set before the
 * call survives). ctlString returns the string at key (owned by obj), else
 * `fallback`. Neither can fail. */
int ctlHasNumber(const cJSON *obj, const char *key, double *out);
const char *ctlString(const cJSON *obj, const char *key, const char *fallback);

/* Checks a run id before it goes into a URL: [A-Za-z0-9_-]{1,64} (proto/api.md).
 * Returns 0, or prints "nsactl: run id '...' ..." and returns -1. */
int ctlCheckRunId(const char *id);

/* The bearer token for TCP: --token, NSAD_TOKEN, --token-file,
 * NSAD_TOKEN_FILE, then <state dir>/token (state dir from --state-dir,
 * NSAD_STATE_DIR, else nsad's default for this user - daemon/paths.h - and
 * then /var/lib/nsad) when that file is readable. Writes it
 * into ctl->target.token. Returns 0 (also when no token is found: health
 * needs none), or -1 after printing why an explicitly named token file could
 * not be read. */
int ctlResolveToken(Ctl *ctl, const char *token_arg, const char *token_file_arg);

#endif
