/* SPDX-License-Identifier: MIT */
/*
 * src/redis_errors.c - error replies to the Redis backend's background
 * work: counted and told, never a silent stall.
 *
 * The claimers, the groups' workers (claim checks and completions) send
 * their commands for no caller: an error reply there (a permission taken
 * away from the user after open, NOPERM; a script error) would otherwise
 * only leave the work undone, to be tried again and again. Each such
 * reply counts in d->errors (tw_durable_stats.errors, the metrics'
 * twheel_durable_errors_total) and the first of a second goes to
 * cfg.on_error with the node (on a cluster: the master of the group),
 * the work and Redis's own text (which never holds a password). A
 * command refused inside a script is not named by Redis before 7.2
 * ("The user executing the script can't run this command"): open's
 * permission probes are sent again to name it. The work itself is tried again
 * as before (a check every RETRY_MS, a claim at the next round, a completion's
 * timer when its lease ends), so it resumes, nothing lost, once Redis does it
 * again. A WRONGTYPE reply is not counted: that is damage in the namespace,
 * which the next script on the shard sets aside and counts as
 * quarantined. The ownership rounds' error replies (src/redis_owner.c:
 * a refused BEAT, ACQ or REL) are counted and told the same way: the
 * round gives up and the node's trust runs out, as with no answer. A
 * caller's own read that is refused (tw_durable_stats_get()'s ZCARD,
 * ZCOUNT, HLEN) is counted too and fails the call (TW_EAUTH), so that
 * no count reads 0 because a command was taken away.
 *
 * Damage only the node can see is set aside here too: a key that a
 * claim found in a shard it does not hash to (fnv1a(key) % shards; a
 * copy made by an operator or a bug) would be delivered beside its real
 * timer, or after that one's cancel, since cancels and replaces go to
 * the shard the key hashes to. Its value goes to that shard's :q as
 * w:<key> (stats.quarantined), the claimer's DONE removes it (only while
 * the claim is still the node's), and cfg.on_error is told (TW_EIO).
 * Thread-safety: any of the store's threads, without mu (the group's master's
 * name is copied under it).
 */
#define _GNU_SOURCE

#include "durable_redis_impl.h"

#define ERR_TELL_GAP_MS 1000 /* on_error at most once in this long */

/* Redis's refusals of the user: a command refused (NOPERM), or one
 * refused inside a script (before 7.2: "can't run this command"). */
static bool refused(const char *s, size_t n)
{
    static const char *const auth[] = {"NOPERM", "NOAUTH", "WRONGPASS",
                                       "can't run this command"};
    for (size_t i = 0; i < sizeof auth / sizeof auth[0]; i++)
        if (memmem(s, n, auth[i], strlen(auth[i])))
            return true;
    return false;
}

static bool counted(const tw__rc_cmd *c)
{
    const redisReply *r = c->reply;
    return r && r->type == REDIS_REPLY_ERROR &&
           !(r->len >= 9 && !memcmp(r->str, "WRONGTYPE", 9)) &&
           strcmp(c->argv[0], "MGET"); /* optional: GET per shard */
}

/* Which command the user may no longer run, for a refusal inside a
 * script (Redis before 7.2 does not name it, and the scripts re-raise
 * errors they caught): open's probes again, on the scratch keys of the
 * namespace (read from shard 0's key name, "{ns:0}:d"). Into @out, ""
 * when the probes pass. */
static void probe_again(struct rd *d, char *out, size_t len)
{
    char ns[80];
    const char *k = d->sk[0].name[0], *colon = strchr(k, '}');
    while (colon && colon > k && *colon != ':')
        colon--;
    *out = 0;
    if (!colon || colon <= k + 1)
        return;
    snprintf(ns, sizeof ns, "%.*s", (int)(colon - k - 1), k + 1);
    if (tw__rd_probe_perms(d, ns) == TW_EAUTH)
        tw__rc_last_error(d->rc, out, len);
}

/* True when cfg.on_error is set and was not called in the last
 * ERR_TELL_GAP_MS: then the caller calls it (and no other thread will
 * for ERR_TELL_GAP_MS). */
static bool may_tell(struct rd *d)
{
    uint64_t now = real_mono_ms();
    uint64_t until = atomic_load(&d->err_quiet_until);
    return d->on_error && now >= until &&
           atomic_compare_exchange_strong(&d->err_quiet_until, &until,
                                          now + ERR_TELL_GAP_MS);
}

/* Tell the error reply of @c to the work @work of group @g (NULL: no
 * node named) to cfg.on_error. */
static void tell(struct rd *d, const struct grp *g, const tw__rc_cmd *c,
                 const char *work)
{
    const redisReply *r = c->reply;
    char node[64] = "", named[300] = "";
    if (g) {
        pthread_mutex_lock(&d->mu);
        size_t gi = (size_t)(g - d->grp);
        if (gi < GROUPS_MAX)
            snprintf(node, sizeof node, "%s", d->grp_name[gi]);
        pthread_mutex_unlock(&d->mu);
    }
    bool ref = refused(r->str, r->len);
    if (ref && !memmem(r->str, r->len, "run the '", 9)) {
        char probe[256];
        probe_again(d, probe, sizeof probe);
        if (*probe)
            snprintf(named, sizeof named, " (the probe: %s)", probe);
    }
    char msg[900];
    snprintf(msg, sizeof msg, "redis%s%s: %s: %.*s%s", *node ? " " : "", node,
             work, (int)(r->len < 400 ? r->len : 400), r->str, named);
    d->on_error(d->on_error_arg, ref ? TW_EAUTH : TW_EIO, msg);
}

/* Count the error replies among @cmds[0..n) in d->errors (@all: every
 * one; else those counted() takes); the first one's index, or @n. */
static size_t count_errors(struct rd *d, const tw__rc_cmd *cmds, size_t n,
                           bool all)
{
    size_t first = n;
    uint64_t count = 0;
    for (size_t i = 0; i < n; i++) {
        const redisReply *r = cmds[i].reply;
        if (all ? !r || r->type != REDIS_REPLY_ERROR : !counted(&cmds[i]))
            continue;
        count++;
        if (first == n)
            first = i;
    }
    if (count)
        atomic_fetch_add(&d->errors, count);
    return first;
}

void tw__rd_bg_errors(struct rd *d, const struct grp *g, const tw__rc_cmd *cmds,
                      const int *script, int one, size_t n)
{
    size_t first = count_errors(d, cmds, n, false);
    if (first == n || !may_tell(d))
        return;
    int s = script ? script[first] : one;
    tell(d, g, &cmds[first],
         s == S_CLAIM ? "CLAIM"
         : s >= 0     ? "completion (DONE)"
                      : "claim check");
}

void tw__rd_own_errors(void *arg, const tw__rc_cmd *cmds, size_t n)
{
    struct rd *d = arg;
    size_t first = count_errors(d, cmds, n, true);
    if (first < n && may_tell(d))
        tell(d, NULL, &cmds[first], "shard ownership");
}

int tw__rd_read_errors(struct rd *d, const tw__rc_cmd *cmds, size_t n)
{
    int rc = 0;
    uint64_t count = 0;
    for (size_t i = 0; i < n; i++) {
        const redisReply *r = cmds[i].reply;
        if (!r || r->type != REDIS_REPLY_ERROR ||
            (r->len >= 9 && !memcmp(r->str, "WRONGTYPE", 9)))
            continue;
        count++;
        if (!rc)
            rc = refused(r->str, r->len) ? TW_EAUTH : TW_EIO;
    }
    atomic_fetch_add(&d->errors, count);
    return rc;
}

/* @s's bytes for a message: printable ASCII, others as '?'. */
static void printable(char *out, size_t len, const char *s, size_t n)
{
    size_t i = 0;
    for (; i < n && i + 1 < len; i++)
        out[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    out[i] = 0;
}

/* One wrong-shard key @k (value @v) of shard @s: the HSET of w:<key>. */
static void wrong_cmd(struct rd *d, uint32_t s, const redisReply *k,
                      const redisReply *v, tw__rc_cmd *cmd, const char **argv,
                      size_t *len, char *field, size_t flen)
{
    size_t kl = k->len < flen - 2 ? k->len : flen - 2;
    memcpy(field, "w:", 2);
    memcpy(field + 2, k->str, kl); /* binary: not a C string */
    argv[0] = "HSET";
    len[0] = 4;
    argv[1] = d->sk[s].name[4]; /* :q */
    len[1] = d->sk[s].len[4];
    argv[2] = field;
    len[2] = 2 + kl;
    argv[3] = v->str;
    len[3] = v->len;
    *cmd = (tw__rc_cmd){4, argv, len, d->sk[s].slot, NULL, 0};
}

/* Tell cfg.on_error of wrong-shard key @k, found in shard @s. */
static void tell_wrong(struct rd *d, uint32_t s, const redisReply *k)
{
    char key[80], msg[400];
    printable(key, sizeof key, k->str, k->len);
    snprintf(msg, sizeof msg,
             "redis: CLAIM: key \"%s\" found in shard %u, which it does not "
             "hash to (shard %u): a copy, set aside as w:<key> in %s",
             key, s, shard_of(d, k->str, k->len), d->sk[s].name[4]);
    d->on_error(d->on_error_arg, TW_EIO, msg);
}

void tw__rd_set_aside_wrong(struct rd *d, const struct call *calls,
                            const tw__rc_cmd *cmds, size_t n)
{
    enum { MAXW = 16 }; /* per round; the rest at the next claim */
    tw__rc_cmd w[MAXW];
    const char *argv[MAXW][4];
    size_t len[MAXW][4], nw = 0;
    char field[MAXW][TW_DURABLE_KEY_MAX + 2];
    for (size_t c = 0; c < n; c++) {
        const redisReply *r = cmds[c].reply;
        if (!r || r->type != REDIS_REPLY_ARRAY)
            continue;
        for (size_t i = 2; i + 3 <= r->elements && nw < MAXW; i += 3) {
            const redisReply *k = r->element[i], *v = r->element[i + 2];
            if (k->type != REDIS_REPLY_STRING ||
                v->type != REDIS_REPLY_STRING ||
                shard_of(d, k->str, k->len) == calls[c].shard)
                continue;
            wrong_cmd(d, calls[c].shard, k, v, &w[nw], argv[nw], len[nw],
                      field[nw], sizeof field[nw]);
            if (!nw && may_tell(d))
                tell_wrong(d, calls[c].shard, k);
            nw++;
        }
    }
    if (!nw)
        return;
    tw__rc_exec(d->rc, w, nw);
    tw__rc_free_replies(w, nw);
}
