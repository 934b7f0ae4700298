/* SPDX-License-Identifier: MIT */
/*
 * src/durable_query.c - twheel/durable.h's look-up and listing calls:
 * argument checks shared by every backend, then the backend's operation
 * (src/durable_backend.h). The journal's ordered index is
 * src/durable_index.c; each backend's operations live with the backend.
 */
#include "twheel/durable.h"

#include <limits.h>
#include <string.h>

#include "durable_backend.h"

static bool refused(tw_durable *d)
{
    return atomic_load_explicit(&d->closing, memory_order_acquire);
}

int tw_durable_get(tw_durable *d, const void *key, size_t key_len,
                   tw_durable_info *info, void *buf, size_t buf_len)
{
    if (!d || !info || !key || key_len < 1 || key_len > TW_DURABLE_KEY_MAX ||
        (buf_len && !buf))
        return TW_EINVAL;
    if (refused(d))
        return TW_ESHUTDOWN;
    tw_durable_info got;
    memset(&got, 0, sizeof got);
    int rc = d->ops->get ? d->ops->get(d, key, key_len, &got, buf, buf_len)
                         : TW_EINVAL;
    if (rc == 0)
        *info = got;
    return rc;
}

int tw_durable_list(tw_durable *d, int64_t from_ms, int64_t to_ms,
                    tw_durable_cursor *cur, tw_durable_entry *out, size_t max,
                    void *keybuf, size_t keybuf_len)
{
    if (!d || !cur || !out || !max || !keybuf || !keybuf_len ||
        cur->key_len > TW_DURABLE_KEY_MAX)
        return TW_EINVAL;
    if (refused(d))
        return TW_ESHUTDOWN;
    if (!d->ops->list)
        return TW_EINVAL;
    /* Dues before 1970 are 0 in both backends' order. The cursor resumes
     * after its entry, unless @from_ms lies beyond it. */
    struct tw__list_req q = {
        .from = from_ms > 0 ? (uint64_t)from_ms : 0,
        /* INT64_MAX: no upper end, a due time of INT64_MAX included. */
        .to = to_ms == INT64_MAX ? UINT64_MAX
              : to_ms > 0        ? (uint64_t)to_ms
                                 : 0,
        .max = max > INT_MAX ? (size_t)INT_MAX : max,
        .keybuf = keybuf,
        .keybuf_len = keybuf_len,
    };
    if (cur->key_len && cur->due_ms >= 0 && (uint64_t)cur->due_ms >= q.from) {
        q.from = (uint64_t)cur->due_ms;
        q.key = cur->key;
        q.key_len = cur->key_len;
        q.after = true;
    }
    bool end = false;
    int n = q.from >= q.to ? 0 : d->ops->list(d, &q, out, &end);
    if (n < 0)
        return n;
    if (n == 0 && q.from < q.to && !end)
        return TW_EINVAL; /* the next key does not fit @keybuf */
    if (n > 0) {
        const tw_durable_entry *last = &out[n - 1];
        cur->due_ms = last->due_ms;
        cur->key_len = (uint32_t)last->key_len;
        memmove(cur->key, last->key, last->key_len);
    }
    cur->done = q.from >= q.to || end;
    return n;
}

long tw_durable_scan(tw_durable *d, tw_durable_scan_fn fn, void *arg)
{
    if (!d || !fn)
        return TW_EINVAL;
    if (refused(d))
        return TW_ESHUTDOWN;
    return d->ops->scan ? d->ops->scan(d, fn, arg) : TW_EINVAL;
}
