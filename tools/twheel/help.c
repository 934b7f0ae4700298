/* SPDX-License-Identifier: MIT */
/*
 * tools/twheel/help.c - twheel's usage text and each verb's own help
 * (twheel VERB --help, twheel journal VERB --help: exit status 0).
 */
#include <string.h>

#include "twheel.h"

static const char general[] =
    "usage: twheel journal VERB DIR [options]\n"
    "       twheel redis VERB --url HOST:PORT[,...] [--ns NS] [--shards N] "
    "[options]\n"
    "       twheel postgres VERB --url CONNINFO [--ns NS] [options]\n"
    "       twheel --version\n"
    "verbs (twheel VERB --help for each):\n"
    "  ls       pending timers in due order\n"
    "  get      one timer: due time, state, attempt, payload\n"
    "  stats    counts (--metrics: Prometheus text format)\n"
    "  check    read everything, change nothing; report what was ignored\n"
    "  repair   drop damaged records, naming each (journal only)\n"
    "  dead     dead letters (timers the retry policy gave up on), by key\n"
    "  rearm    make a dead letter pending again\n"
    "  delete   drop a dead letter\n"
    "  export   every timer and dead letter, with payloads, as JSON lines\n"
    "  import   schedule what export wrote into a store\n"
    "  jobs     twheeld's jobs, decoded (id, state, tube, counters, body)\n"
    "  init     postgres: install or upgrade the schema twheel, start no "
    "node\n"
    "options: --json     machine-readable output\n"
    "         --help     this text, or a verb's\n"
    "         --version  the tool's and library's version\n"
    "environment: TWHEEL_REDIS_USER, TWHEEL_REDIS_PASSWORD (kept off the "
    "command line);\nPGPASSWORD, ~/.pgpass and libpq's other variables for "
    "postgres\n"
    "exit status: 0 done; 1 damage, key not held or not a dead letter; "
    "2 usage\nor another error; 3 check: sound, but a torn tail was ignored "
    "or nothing\nis there.\n"
    "Read-only verbs never take the journal's lock and never deliver a "
    "timer;\nrepair, rearm, delete and import into a journal refuse a "
    "directory that a\nlive store holds.\n";

static const struct {
    const char *verb, *text;
} verbs[] = {
    {"ls", "twheel journal|redis|postgres ls [--from MS] [--to MS] [--limit N] "
           "[--after DUE,KEY] [--json]\n"
           "Pending timers in order of due time, then key bytes: due time "
           "(UTC), state\n(waiting, due) and key. --from/--to: due in [from, "
           "to), Unix ms. --limit N:\nat most N; the last line then says "
           "where to resume (--after DUE,KEY).\nOn a journal damaged in its "
           "middle: what a repair would keep, a warning,\nexit status 1.\n"},
    {"get", "twheel journal|redis|postgres get KEY [--json]\n"
            "One timer or dead letter: due time, state, attempt, payload. "
            "Exit status 1\nwhen the store does not hold KEY.\n"},
    {"stats", "twheel journal|redis|postgres stats [--metrics] [--json]\n"
              "Pending timers, backlog, dead letters; for a journal its "
              "segments, bytes and\nlast recovery. --metrics: every counter "
              "in the Prometheus text format.\nWarns on stderr when nothing "
              "is there. On a journal damaged in its middle:\nwhat a repair "
              "would keep, a warning, exit status 1.\n"},
    {"check", "twheel journal|redis|postgres check [--json]\n"
              "Reads every record and changes nothing, then reads each "
              "pending timer back.\nReports each thing ignored: a torn tail "
              "(segment, offset, bytes, the records\nin it). Exit status 0 "
              "sound; 1 damaged (segment and offset named); 3 sound\nbut a "
              "torn tail was ignored, or nothing is there (no such "
              "directory, no\nsegment, a namespace without timers or dead "
              "letters).\n"},
    {"repair", "twheel journal repair DIR [--dry-run] [--json]\n"
               "When check finds damage in the middle of the journal: drop "
               "the damaged\nrecords, naming each record's key and what its "
               "loss did (dropped, an older\nversion kept, pending again), "
               "and keep the rest; nothing is delivered.\nRefuses a "
               "directory a live store holds. --dry-run: report only (exit "
               "1\nwhen there is damage).\n"},
    {"dead",
     "twheel journal|redis|postgres dead [--limit N] [--after KEY] [--json]\n"
     "Dead letters in key order: due time of the last delivery, "
     "attempts, key.\n--limit N: at most N; the last line then "
     "says where to resume (--after KEY).\n"},
    {"rearm", "twheel journal|redis|postgres rearm KEY [--at MS] [--json]\n"
              "Make dead letter KEY pending again at MS (Unix ms; default "
              "now), its\nattempts counted from 1. Exit status 1 when KEY is "
              "not a dead letter.\n"},
    {"delete", "twheel journal|redis|postgres delete KEY [--json]\n"
               "Drop dead letter KEY for good. Exit status 1 when KEY is not "
               "a dead letter.\n"},
    {"export", "twheel journal|redis|postgres export [--out FILE]\n"
               "Every pending timer and dead letter, with its payload, as "
               "JSON lines\n(one object a line; twheel(1) gives the fields) "
               "on stdout or into FILE.\nRead-only.\n"},
    {"jobs", "twheel journal|redis jobs [--limit N] [--after ID] [--json]\n"
             "The jobs of a twheeld store (-b DIR, or --redis with its "
             "namespace),\ndecoded from their records: id, state, tube, "
             "priority, TTR, due time,\nreserves/timeouts/releases/buries/"
             "kicks and the body (its first 40 bytes;\n--json: all). In no "
             "particular order. --limit N: the N of lowest ids above\n"
             "--after ID (0 without it); the last line then says where to "
             "resume\n(--json: \"after\", null at the end). Exit status 1 "
             "when a record cannot\nbe read. Read-only.\n"},
    {"init", "twheel postgres init --url CONNINFO [--json]\n"
             "Install the schema twheel (tables, SQL functions) in the "
             "database, or bring\nan older one up to this library's version, "
             "as a node's open would, without\nstarting a node: nothing is "
             "claimed or delivered. Run again, it changes\nnothing (exit "
             "0). A schema newer than the library is refused, both "
             "versions\nnamed (exit 2). Needs a role that may create the "
             "schema; nodes then need\nonly the grants of "
             "docs/guide/postgres.md.\n"},
    {"import", "twheel journal|redis|postgres import [--in FILE] [--replace] "
               "[--json]\n"
               "Schedule the lines of an export (stdin or FILE) into the "
               "store: timers at\ntheir due time and payload, dead letters "
               "as dead letters with their\nattempts. A key the store holds "
               "already is an error (exit 1, nothing of it\nchanged) unless "
               "--replace. A journal is opened with its lock (not "
               "while\na live store holds it); nothing is delivered.\n"},
};

int help(FILE *f, const char *verb, int rc)
{
    for (size_t i = 0; verb && i < sizeof verbs / sizeof *verbs; i++)
        if (!strcmp(verb, verbs[i].verb)) {
            fprintf(f, "usage: %s", verbs[i].text);
            return rc;
        }
    fputs(general, f);
    return rc;
}
