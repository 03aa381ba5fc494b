/* cmdtable.c - nsactl's command table: each command's name, synopsis,
 * one-line summary and help text (what `nsactl --help` and `nsactl CMD
 * --help` print), its aliases, and the lookups over them (see ctlcmd.h).
 * The commands themselves are in commands.c, watch.c's caller there, and
 * use.c. */
#include "ctlcmd.h"

#include <stdio.h>
#include <string.h>

#include "suggest.h"

const CtlCommand ctlCommands[] = {
    {"start",
     "start CONFIG [--name NAME] [--gpus all|N|I,J,...] [--nodes HOST:PORT,...] [--init-from "
     "RUN_ID|DIR] [--wait] [--no-queue] [--watch] [--interval S]",
     "start a run from a job config (YAML or JSON; - is stdin)",
     "Sends CONFIG to nsad, which validates it and starts the run on a trainer,\n"
     "or, while another run holds GPUs it needs (or a run queued before it wants\n"
     "them), queues it: it starts on its turn. Runs on disjoint GPUs train at\n"
     "once. Prints the new run's id (with --json: the run object).\n"
     "  --name NAME     a label for the run (1-64 of A-Z a-z 0-9 . _ -)\n"
     "  --gpus G        runtime.gpus over the config's: all, a count (the first\n"
     "                  N GPUs) or ordinals (1 GPU: [1]; several: 0,2)\n"
     "  --init-from X   train.init_from over the config's: start from the weights\n"
     "                  of run X's latest checkpoint (or of a checkpoint DIR, a\n"
     "                  path with a '/'), fixed when nsad takes the run; the\n"
     "                  optimizer, step and data start afresh (fine-tuning)\n"
     "  --wait          return once the run has started (left the queue and\n"
     "                  starting); exit 1 when it ended before it ran\n"
     "  --no-queue      exit 5 instead of queueing when the run would wait\n"
     "  --watch         then follow it as `nsactl watch` does\n"
     "  --interval S    poll period for --watch (default 1)\n"
     "Exit 78 when the file is missing or unreadable or nsad rejects the config\n"
     "(the message names the key, the value and what is allowed); 5 with\n"
     "--no-queue when another run holds what this one needs.\n",
     ctlCmdStart},
    {"status", "status [ID]", "the daemon and its active run, or one run in detail",
     "Without ID: version, uptime, trainer state and the active runs.\n"
     "With ID: every field of that run (state, step, loss, speed, ETA, memory,\n"
     "checkpoint, errors). --json prints the daemon's run object; without ID\n"
     "{\"health\": ..., \"active\": <run>|null, \"active_runs\": [<run>...], \"runs\": N}.\n",
     ctlCmdStatus},
    {"list", "list", "every run nsad knows, newest first, and the queue",
     "A table of id, name, state, step, loss, tokens/s, device (a CUDA run's\n"
     "GPUs: cuda:0,1) and creation time;\n"
     "a queued run's state shows its place (queued #1 starts next).\n"
     "--json prints {\"runs\": [...], \"active\": ID|null, \"active_runs\": [ID, ...],\n"
     "\"queue\": [ID, ...]}.\n",
     ctlCmdList},
    {"front", "front ID", "move a queued run to the front of the queue",
     "Nobody waits before it then: it starts as soon as the GPUs it needs are\n"
     "free (running runs keep theirs).\n"
     "Exit 5 when the run is not queued, 4 when there is no such run.\n",
     ctlCmdFront},
    {"halt", "halt ID [--wait]", "stop a run after its current step and a checkpoint",
     "The run goes to halting, then halted; `nsactl resume ID` continues it.\n"
     "A queued run leaves the queue at once (halted, its files kept).\n"
     "  --wait    return only once it is halted (or ended otherwise)\n"
     "Exit 5 when the run is not active (already ended).\n",
     ctlCmdHalt},
    {"resume", "resume ID [--wait] [--no-queue]",
     "continue a halted or failed run from its checkpoint",
     "Same id, same metric series. While another run trains it is queued.\n"
     "  --wait      return only once it left the queue and starting\n"
     "  --no-queue  exit 5 instead of queueing when the run would wait\n"
     "Exit 5 when the run's state does not allow it.\n",
     ctlCmdResume},
    {"delete", "delete ID", "remove an ended or queued run: its record, logs and checkpoints",
     "For runs that are not active (halt a running one first); a queued run is\n"
     "taken out of the queue and removed (cancelled). Nothing of it is\n"
     "kept. --json prints {\"run_id\": ID, \"deleted\": true}.\n"
     "Exit 5 when the run is active, 4 when there is no such run.\n",
     ctlCmdDelete},
    {"metrics", "metrics ID [--since STEP] [--last N]",
     "a run's logged training and validation samples",
     "  --since STEP   samples at or after this step (default 0)\n"
     "  --last N       show only the newest N training rows (default 20; 0: all);\n"
     "                 --json always prints the daemon's whole answer\n",
     ctlCmdMetrics},
    {"events", "events ID [--since SEQ]",
     "a run's events: start, checkpoints, anomalies, hangs, end",
     "  --since SEQ    events with seq >= SEQ\n", ctlCmdEvents},
    {"logs", "logs ID [-f] [--tail N]", "the daemon's log lines for one run; -f follows them",
     "What nsad logged about the run: its creation, start or resume, checkpoints,\n"
     "evaluations, warnings, anomalies, hangs and how it ended (the run's part of\n"
     "the journal, kept in the state dir).\n"
     "  -f, --follow   keep printing new lines until the run's job ends (Ctrl-C\n"
     "                 to stop); a run that is not active prints what it has\n"
     "  --tail N       only the last N stored lines first (default: all)\n"
     "--json prints the daemon's JSON lines ({\"ts\",\"level\",\"message\"}).\n"
     "Not bounded by --timeout.\n",
     ctlCmdLogs},
    {"stacks", "stacks", "dump every nsad thread's stack (for a run that seems stuck)",
     "Prints the trainer's phase and how long it has been in it, what it last\n"
     "knew of the device, then the stacks.\n"
     "nsad also writes them to its log.\n",
     ctlCmdStacks},
    {"watch", "watch ID [--interval S]", "follow a run live until it ends (step, loss, tok/s, ETA)",
     "On a terminal one line is redrawn in place; otherwise a line is printed per\n"
     "change; --json prints the run object (without config) per change.\n"
     "Rides out a daemon restart of up to 60 s.\n"
     "  --interval S   poll period in seconds (default 1)\n"
     "Exit 0 when the run completed or was halted, 1 when it failed or the NaN\n"
     "guard stopped it.\n",
     ctlCmdWatch},
    {"dashboard", "dashboard", "print the dashboard URL, with the token in its fragment",
     "The URL is nsad's TCP address (asked of nsad over the socket, or --url)\n"
     "plus /#token=TOKEN; the token comes from --token, --token-file or the\n"
     "state dir (see nsactl --help).\n",
     ctlCmdDashboard},
    {"sample",
     "sample ID|CHECKPOINT_DIR --prompt TEXT|--prompt-ids ID,ID,... [--n N] [--max-tokens N]\n"
     "       [--temperature T] [--top-k K] [--top-p P] [--seed S] [--stop TEXT] [--device D]",
     "generate text (or token ids) from a run's latest checkpoint (or a checkpoint directory), "
     "streamed",
     "nsad continues the prompt with NSA's decode caches and the text is printed as it\n"
     "is generated; a summary (tokens, why it stopped, tokens/s) goes to stderr.\n"
     "--n N (1 to 16) asks for N continuations of the prompt, decoded together after\n"
     "one prefill; each is printed under a '--- sample I ---' line once all are done.\n"
     "Defaults: 200 tokens, temperature 0.8 (0 is greedy), top-k off, top-p 0.95,\n"
     "seed 1; the daemon's GPU when it has one (--device cpu|cuda). --stop ends the\n"
     "text at that string (not with --prompt-ids).\n"
     "--prompt-ids: the prompt as token ids (1 to 65536, commas or spaces between,\n"
     "each below the model's vocabulary); the prompt's and the new tokens' ids are\n"
     "printed space-separated, one line per continuation, as `nsad sample\n"
     "--prompt-ids` prints them: the way to sample a model with no text form (one\n"
     "trained on token shards of a tokenizer nsad does not run). An id outside the\n"
     "vocabulary, or a text prompt to such a model, is refused (exit 1).\n"
     "--json prints the daemon's JSON lines as they come. Not bounded by --timeout.\n",
     ctlCmdSample},
    {"eval",
     "eval ID|CHECKPOINT_DIR --data PATH [--seq-len N] [--batch N] [--max-tokens N] [--device D]",
     "held-out loss and bits per byte of a checkpoint on a data file",
     "PATH (.txt, .jsonl, a directory of them, or .bin token shards; as the daemon\n"
     "sees it) is cut into consecutive windows of seq_len + 1 tokens, every\n"
     "prediction scored. Progress on stderr, the result on stdout. Defaults: the\n"
     "run's seq_len, batch min(batch_size, 4), the whole file. Not bounded by\n"
     "--timeout.\n",
     ctlCmdEval},
    {"export", "export ID|CHECKPOINT_DIR --out DIR [--dtype bf16|f32]",
     "download a checkpoint's weights as an export (safetensors, config.json, model card)",
     "nsad makes the export of the run's latest checkpoint (or of a checkpoint\n"
     "directory as it sees it) in its state dir - or finds it made already - and\n"
     "nsactl downloads its three files into DIR (created when missing; a file there\n"
     "already is refused, nothing is overwritten): what `nsad export` writes on the\n"
     "daemon's machine, here. --dtype bf16 (default) or f32 (the master weights).\n"
     "Progress on stderr. Not bounded by --timeout.\n",
     ctlCmdExport},
    {"version", "version", "nsactl's and nsad's versions", "", ctlCmdVersion},
    {NULL, NULL, NULL, NULL, NULL},
};

const CtlAlias ctlAliases[] = {
    {"ps", "list"}, {"ls", "list"}, {"rm", "delete"}, {"stop", "halt"}, {NULL, NULL},
};

const CtlCommand *ctlFindCommand(const char *name) {
    for (const CtlAlias *a = ctlAliases; a->alias; a++)
        if (!strcmp(a->alias, name)) name = a->command;
    for (const CtlCommand *c = ctlCommands; c->name; c++)
        if (!strcmp(c->name, name)) return c;
    return NULL;
}

char *ctlAliasesOf(const char *command, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (const CtlAlias *a = ctlAliases; a->alias && used < cap; a++) {
        if (strcmp(a->command, command)) continue;
        int k = snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", a->alias);
        if (k < 0) break;
        used += (size_t)k;
    }
    return buf;
}

void ctlUnknownCommand(const char *name) {
    const char *words[64], *close[SUGGEST_MAX];
    size_t n = 0;
    for (const CtlCommand *c = ctlCommands; c->name && n < 64; c++)
        words[n++] = c->name;
    for (const CtlAlias *a = ctlAliases; a->alias && n < 64; a++)
        words[n++] = a->alias;
    int n_close = suggestWords(name, words, n, close);
    char list[256];
    if (n_close)
        fprintf(
            stderr,
            "nsactl: unknown command '%s'; did you mean %s? (nsactl --help lists the commands)\n",
            name, suggestList(close, n_close, list, sizeof list));
    else
        fprintf(stderr, "nsactl: unknown command '%s' (nsactl --help lists the commands)\n", name);
}
