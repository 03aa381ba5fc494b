/* peers.h - a multi-node job's coordinator asking the other nodes' nsad
 * daemons to join (runtime.nodes), over their authenticated HTTP API
 * (POST /api/v1/join, proto/api.md): first how many ranks each brings
 * (prepare), then, with the rank layout and the transport's id (NCCL's
 * unique id, or the TCP transport's address and key), to start the job's
 * member run (start). Nothing else travels between the daemons: the ranks
 * then talk through the transport. Every call is bounded (connect 5 s,
 * whole call 30 s) and fails with a one-line error naming the node. */
#ifndef NSAD_PEERS_H
#define NSAD_PEERS_H

#include <stddef.h>
#include "../kernels/nsa.h"

/* What a joining node needs to start its part of the job. */
typedef struct PeerStart {
    const char *config_yaml;   /* the job, as the coordinator resolved it */
    const char *run_id;        /* the coordinator's run id */
    int first, world;          /* the node's first rank, the job's ranks */
    NsaCommId comm_id;
    int resume;                /* the coordinator loads a checkpoint: take part */
} PeerStart;

/* Asks node ("HOST:PORT") how many ranks it brings for the job (its GPUs
 * as runtime.gpus names them there, or runtime.cpu_ranks). token may be
 * NULL (a node without auth). On success *local is set, and local_ip (cap
 * bytes) receives this machine's address as that node reaches it (the TCP
 * transport's rank 0 address for it). Returns 0 or -1 with err. */
int peerPrepare(const char *node, const char *token, const char *config_yaml, int *local,
                char *local_ip, size_t cap, NsaError *err);

/* Starts the node's member run. member_id (cap bytes) receives its run id
 * there. Returns 0 or -1 with err. */
int peerStart(const char *node, const char *token, const PeerStart *start, char *member_id,
              size_t cap, NsaError *err);

/* The id as hex (2 x NSA_COMM_ID_BYTES + 1 bytes) and back (0 or -1). */
void peerIdToHex(const NsaCommId *id, char *hex);
int peerIdFromHex(const char *hex, NsaCommId *id);

#endif
