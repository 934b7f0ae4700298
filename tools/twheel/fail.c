/* SPDX-License-Identifier: MIT */
/*
 * tools/twheel/fail.c - with --json, the one document of a verb that
 * could not run: the store did not open (no such directory, no schema, a
 * server not reachable, a namespace refused) or a call failed before any
 * output. twheel(1) promises one JSON object of one shape per verb
 * whatever the outcome, so each verb's failure prints that verb's fields
 * (empty lists, zero counts, null for what is not known) and an "error"
 * field with the message that standard error shows too.
 */
#include <string.h>

#include "twheel.h"

static void key_fields(const struct opts *o)
{
    size_t kl = o->key ? strlen(o->key) : 0;
    printf("\"key\":");
    if (o->key)
        json_str(o->key, kl);
    else
        printf("null");
    printf(",\"key_hex\":");
    if (o->key) {
        putchar('"');
        hex(o->key, kl);
        putchar('"');
    } else {
        printf("null");
    }
}

/* The fields of @o->verb's document before "error". */
static void verb_fields(const struct opts *o)
{
    const char *v = o->verb;
    if (!strcmp(v, "ls") || !strcmp(v, "dead")) {
        printf("\"%s\":[],\"count\":0,\"more\":false,\"after\":null",
               !strcmp(v, "ls") ? "timers" : v);
    } else if (!strcmp(v, "jobs")) {
        printf("\"jobs\":[],\"after\":null,\"count\":0,\"id_marks\":0,"
               "\"other\":0,\"unreadable\":0");
    } else if (!strcmp(v, "get")) {
        printf("\"found\":false,");
        key_fields(o);
        printf(",\"due_ms\":null,\"due\":null,\"state\":null,\"attempt\":"
               "null,\"payload_len\":null,\"payload\":null,\"payload_hex\":"
               "null");
    } else if (!strcmp(v, "stats")) {
        printf("\"pending\":null,\"backlog\":null,\"dead\":null");
        if (o->dir)
            printf(",\"segments\":null,\"journal_bytes\":null,\"recovered\":"
                   "null,\"recovery_us\":null");
    } else if (!strcmp(v, "check")) {
        printf("\"ok\":false,\"status\":\"error\",\"timers\":0,\"dead\":0,"
               "\"ignored\":[]");
    } else if (!strcmp(v, "repair")) {
        printf("\"ok\":false,\"repaired\":false,\"dry_run\":%s,\"damage\":"
               "null,\"kept\":0,\"ignored\":[]",
               o->dry_run ? "true" : "false");
    } else if (!strcmp(v, "rearm") || !strcmp(v, "delete")) {
        printf("\"ok\":false,\"dead\":false,");
        key_fields(o);
        printf(",\"due_ms\":null,\"due\":null");
    } else if (!strcmp(v, "import")) {
        printf("\"ok\":false,\"timers\":0,\"dead\":0,\"held\":0,"
               "\"replaced\":0");
    } else if (!strcmp(v, "init")) {
        printf("\"ok\":false,\"installed\":false,\"upgraded\":false");
    } else {
        printf("\"ok\":false");
    }
}

void json_fail(const struct opts *o, const char *msg)
{
    if (!o->json || !strcmp(o->verb, "export"))
        return; /* export writes JSON lines, never one document */
    putchar('{');
    verb_fields(o);
    if (!strcmp(o->verb, "check")) {
        printf(",\"problem\":");
        json_str(msg, strlen(msg));
    }
    printf(",\"error\":");
    json_str(msg, strlen(msg));
    puts("}");
}
