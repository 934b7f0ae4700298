/* SPDX-License-Identifier: MIT */
/*
 * src/durable_pg_schema.c - the PostgreSQL backend's schema "twheel",
 * installed and versioned by open.
 *
 * One schema serves every namespace (the ns column) of a database:
 *   twheel.version  one row: the schema's version (PG_SCHEMA_V)
 *   twheel.ver_seq  the versions of rows (src/durable_pg.h)
 *   twheel.timers   pending timers: (ns, key) -> due (Unix ms), payload,
 *                   attempts (deliveries begun), ver, and the claim of the
 *                   node delivering it (owner, lease_until by the
 *                   database's clock); indexed by (ns, greatest(due, 0),
 *                   key), the order of claims and listings
 *   twheel.dead     dead letters: (ns, key) -> due, payload, attempts
 *   twheel.quarantine  rows a node set aside, never delivered: a copy of
 *                   the row and why (src/durable_pg_fire.c, sweep())
 * A trigger renews ver on any UPDATE of a row's timer that kept it (an
 * UPDATE written by hand), so completions stay fenced; one of the claim
 * alone (owner, lease_until: a touch) keeps it.
 * The CHECK constraints hold the library's limits (namespaces of 1 .. 64
 * bytes, keys of 1 .. 1024 bytes, payloads up to 1 MiB), so a row written by
 * hand or by another program that breaks them is refused by the database, never
 * read.
 *
 * SQL functions, for any client inside any transaction (committed: the
 * timer will fire; rolled back: it never does):
 *   twheel.schedule(ns, key bytea, due_ms bigint, payload bytea) -> ver
 *   twheel.schedule(ns, key text, due timestamptz, payload text = '')
 *   twheel.schedule_many(ns, keys bytea[], dues_ms bigint[],
 *                        payloads bytea[]) -> the versions, in order
 *   twheel.schedule_many(ns, keys text[], dues timestamptz[],
 *                        payloads text[] = NULL)
 *     a batch in one INSERT: what schedule() in a loop does
 *   twheel.cancel(ns, key bytea | text) -> whether it was pending
 * schedule of a timer due within PG_NOTIFY_MS sends NOTIFY twheel,
 * payload ns, at commit, which wakes the nodes (deduplicated by the
 * server within a transaction); a later one does not notify (a notifying
 * commit takes a server-wide lock until its WAL is flushed, so notifying
 * commits cannot share an fsync): the nodes' poll finds it. The library's
 * own conditional writes and restores are functions too
 * (twheel.schedule_if, cancel_if, cancel_v, restore), each one statement
 * for the node. Every function runs with the caller's rights and a fixed
 * search_path.
 *
 * Open takes an advisory lock for the install, so nodes that start
 * together install it once; a database with a newer version is refused
 * (TW_EINVAL) rather than written with an older layout. A role that may
 * not create the schema can still run nodes once an owner installed it:
 * open then checks only the privileges a node uses (docs/guide/postgres.md).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "durable_pg.h"
#include "common.h"

/* twheel.soon, schedule and schedule_many (below) spell PG_NOTIFY_MS
 * out. */
_Static_assert(PG_NOTIFY_MS == 2000, "the near-due rule of schema_v1");

static const char schema_v1[] =
    "CREATE SCHEMA IF NOT EXISTS twheel;"
    "CREATE TABLE twheel.version (v integer NOT NULL);"
    "INSERT INTO twheel.version VALUES (1);"
    "CREATE SEQUENCE twheel.ver_seq;"
    "CREATE TABLE twheel.timers ("
    " ns text NOT NULL CHECK (octet_length(ns) BETWEEN 1 AND 64),"
    " key bytea NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 1024),"
    " due bigint NOT NULL,"
    " payload bytea NOT NULL CHECK (octet_length(payload) <= 1048576),"
    " attempts integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),"
    " ver bigint NOT NULL DEFAULT nextval('twheel.ver_seq'),"
    " owner text, lease_until timestamptz,"
    " PRIMARY KEY (ns, key));"
    "CREATE INDEX timers_due ON twheel.timers (ns, (greatest(due, 0)), key);"
    /* Any other UPDATE of a row's timer (due, payload, attempts, its
     * name) that keeps ver, a hand-written one say, renews it: the
     * completion of a delivery claimed before is fenced off by it. */
    "CREATE FUNCTION twheel.renew_ver() RETURNS trigger LANGUAGE plpgsql"
    " SET search_path = pg_catalog AS $f$ BEGIN"
    " NEW.ver := nextval('twheel.ver_seq'); RETURN NEW; END $f$;"
    "CREATE TRIGGER renew_ver BEFORE UPDATE ON twheel.timers FOR EACH ROW"
    " WHEN (NEW.ver = OLD.ver AND (NEW.ns, NEW.key, NEW.due, NEW.payload,"
    " NEW.attempts) IS DISTINCT FROM (OLD.ns, OLD.key, OLD.due, OLD.payload,"
    " OLD.attempts)) EXECUTE FUNCTION twheel.renew_ver();"
    "CREATE TABLE twheel.quarantine ("
    " ns text NOT NULL, key bytea NOT NULL, due bigint, payload bytea,"
    " attempts integer, owner text, lease_until timestamptz,"
    " why text NOT NULL, at timestamptz NOT NULL DEFAULT now());"
    "CREATE INDEX quarantine_ns ON twheel.quarantine (ns);"
    "CREATE TABLE twheel.dead ("
    " ns text NOT NULL CHECK (octet_length(ns) BETWEEN 1 AND 64),"
    " key bytea NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 1024),"
    " due bigint NOT NULL,"
    " payload bytea NOT NULL CHECK (octet_length(payload) <= 1048576),"
    " attempts integer NOT NULL CHECK (attempts >= 0),"
    " died timestamptz NOT NULL DEFAULT now(),"
    " PRIMARY KEY (ns, key));"
    /* soon: the due times (Unix ms) before which a write NOTIFYs the
     * nodes: within PG_NOTIFY_MS of the database's clock. A later one is
     * found by the nodes' poll (every PG_REFRESH_MS) before it is due. */
    "CREATE FUNCTION twheel.soon() RETURNS bigint LANGUAGE sql"
    " SET search_path = pg_catalog AS $f$ SELECT floor(extract(epoch FROM"
    " clock_timestamp()) * 1000)::bigint + 2000 $f$;"
    /* schedule: insert or replace; a dead letter of the key is replaced.
     * plpgsql, whose statements keep their plans for the session; the
     * near-due rule is twheel.soon written out (a function with its own
     * search_path is called, never inlined: a plan a call). */
    "CREATE FUNCTION twheel.schedule(p_ns text, p_key bytea, p_due bigint,"
    " p_payload bytea) RETURNS bigint LANGUAGE plpgsql"
    " SET search_path = pg_catalog AS $f$ DECLARE v bigint; BEGIN"
    " DELETE FROM twheel.dead WHERE ns = p_ns AND key = p_key;"
    " INSERT INTO twheel.timers AS t (ns, key, due, payload)"
    " VALUES (p_ns, p_key, p_due, coalesce(p_payload, ''::bytea))"
    " ON CONFLICT (ns, key) DO UPDATE SET due = excluded.due,"
    " payload = excluded.payload, attempts = 0,"
    " ver = nextval('twheel.ver_seq'), owner = NULL, lease_until = NULL"
    " RETURNING t.ver INTO v;"
    " IF p_due < floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
    " + 2000 THEN PERFORM pg_notify('twheel', p_ns); END IF;"
    " RETURN v; END $f$;"
    "CREATE FUNCTION twheel.schedule(p_ns text, p_key text,"
    " p_due timestamptz, p_payload text DEFAULT '') RETURNS bigint"
    " LANGUAGE plpgsql SET search_path = pg_catalog AS $f$ BEGIN"
    " RETURN twheel.schedule(p_ns, convert_to(p_key, 'UTF8'),"
    " floor(extract(epoch FROM p_due) * 1000)::bigint,"
    " convert_to(p_payload, 'UTF8')); END $f$;"
    /* schedule_many: what a loop of schedule() in the arrays' order does
     * (a key given twice ends with its last item): the versions in the
     * items' order (a key given twice: its last write's for each of its
     * items). First a plain INSERT in key order of the items with a
     * version each, taken before (new keys, the usual case: no
     * speculative insertion, 20% less server CPU than ON CONFLICT at 32
     * a call, and no RETURNING to match back to the items); if a key is
     * there (or given twice), that is undone and one INSERT ... ON
     * CONFLICT of each key's last item replaces. Key order: batches with
     * keys in common never deadlock. The dead letters are looked up by
     * key only when the namespace has one (a namespace without: one
     * probe rather than one a key). NULL payloads are empty. */
    "CREATE FUNCTION twheel.schedule_many(p_ns text, p_keys bytea[],"
    " p_dues bigint[], p_payloads bytea[]) RETURNS bigint[]"
    " LANGUAGE plpgsql SET search_path = pg_catalog AS $f$"
    " DECLARE v bigint[]; BEGIN"
    " IF cardinality(p_keys) <> cardinality(p_dues) OR cardinality(p_keys)"
    " <> cardinality(p_payloads) THEN RAISE EXCEPTION"
    " 'twheel.schedule_many: arrays of unequal lengths'"
    " USING ERRCODE = '22023'; END IF;"
    " IF EXISTS (SELECT FROM twheel.dead WHERE ns = p_ns) THEN"
    "  DELETE FROM twheel.dead WHERE ns = p_ns AND key = ANY (p_keys);"
    " END IF;"
    " v := ARRAY(SELECT nextval('twheel.ver_seq') FROM unnest(p_keys));"
    " BEGIN"
    "  INSERT INTO twheel.timers (ns, key, due, payload, ver)"
    "  SELECT p_ns, u.k, u.d, coalesce(u.p, ''::bytea), u.v FROM unnest("
    "  p_keys, p_dues, p_payloads, v) AS u(k, d, p, v) ORDER BY u.k;"
    " EXCEPTION WHEN unique_violation THEN"
    "  WITH u AS (SELECT * FROM unnest(p_keys, p_dues, p_payloads)"
    "  WITH ORDINALITY AS u(k, d, p, i)),"
    "  w AS (INSERT INTO twheel.timers AS t (ns, key, due, payload)"
    "  SELECT p_ns, l.k, l.d, coalesce(l.p, ''::bytea) FROM (SELECT DISTINCT"
    "  ON (k) k, d, p FROM u ORDER BY k, i DESC) l ORDER BY l.k"
    "  ON CONFLICT (ns, key) DO UPDATE SET due = excluded.due,"
    "  payload = excluded.payload, attempts = 0,"
    "  ver = nextval('twheel.ver_seq'), owner = NULL, lease_until = NULL"
    "  RETURNING t.key, t.ver)"
    "  SELECT array_agg(w.ver ORDER BY u.i) INTO v FROM u JOIN w ON w.key = "
    "u.k;"
    " END;"
    " IF (SELECT min(d) FROM unnest(p_dues) d) < floor(extract(epoch FROM"
    " clock_timestamp()) * 1000)::bigint + 2000"
    " THEN PERFORM pg_notify('twheel', p_ns); END IF;"
    " RETURN coalesce(v, '{}'); END $f$;"
    "CREATE FUNCTION twheel.schedule_many(p_ns text, p_keys text[],"
    " p_dues timestamptz[], p_payloads text[] DEFAULT NULL) RETURNS bigint[]"
    " LANGUAGE plpgsql SET search_path = pg_catalog AS $f$ BEGIN"
    " RETURN twheel.schedule_many(p_ns, ARRAY(SELECT convert_to(k, 'UTF8')"
    " FROM unnest(p_keys) WITH ORDINALITY AS a(k, i) ORDER BY i),"
    " ARRAY(SELECT floor(extract(epoch FROM d) * 1000)::bigint"
    " FROM unnest(p_dues) WITH ORDINALITY AS a(d, i) ORDER BY i),"
    " ARRAY(SELECT convert_to(coalesce(p, ''), 'UTF8') FROM unnest("
    " coalesce(p_payloads, array_fill(NULL::text, ARRAY[cardinality(p_keys)])))"
    " WITH ORDINALITY AS a(p, i) ORDER BY i)); END $f$;"
    "CREATE FUNCTION twheel.cancel(p_ns text, p_key bytea) RETURNS boolean"
    " LANGUAGE plpgsql SET search_path = pg_catalog AS $f$ BEGIN"
    " DELETE FROM twheel.timers WHERE ns = p_ns AND key = p_key;"
    " RETURN FOUND; END $f$;"
    "CREATE FUNCTION twheel.cancel(p_ns text, p_key text) RETURNS boolean"
    " LANGUAGE plpgsql SET search_path = pg_catalog AS $f$ BEGIN"
    " RETURN twheel.cancel(p_ns, convert_to(p_key, 'UTF8')); END $f$;"
    /* cancel_v: a cancel that returns a version taken after its delete
     * (0: not pending), for the local rule of src/durable_pg.h. */
    "CREATE FUNCTION twheel.cancel_v(p_ns text, p_key bytea) RETURNS bigint"
    " LANGUAGE plpgsql SET search_path = pg_catalog AS $f$ BEGIN"
    " DELETE FROM twheel.timers WHERE ns = p_ns AND key = p_key;"
    " IF NOT FOUND THEN RETURN 0; END IF;"
    " RETURN nextval('twheel.ver_seq'); END $f$;"
    /* schedule_if: -1 stale, -2 not pending, else the new version. */
    "CREATE FUNCTION twheel.schedule_if(p_ns text, p_key bytea,"
    " p_due bigint, p_payload bytea, p_expect bytea) RETURNS bigint"
    " LANGUAGE plpgsql SET search_path = pg_catalog AS $f$"
    " DECLARE cur bytea; v bigint; BEGIN"
    " IF p_expect IS NULL THEN"
    "  INSERT INTO twheel.timers AS t (ns, key, due, payload)"
    "  VALUES (p_ns, p_key, p_due, p_payload) ON CONFLICT DO NOTHING"
    "  RETURNING t.ver INTO v;"
    "  IF v IS NULL THEN RETURN -1; END IF;"
    "  DELETE FROM twheel.dead WHERE ns = p_ns AND key = p_key;"
    " ELSE"
    "  SELECT payload INTO cur FROM twheel.timers"
    "  WHERE ns = p_ns AND key = p_key FOR UPDATE;"
    "  IF NOT FOUND THEN RETURN -2; END IF;"
    "  IF substring(cur FROM 1 FOR octet_length(p_expect)) <> p_expect"
    "  THEN RETURN -1; END IF;"
    "  UPDATE twheel.timers SET due = p_due, payload = p_payload,"
    "  attempts = 0, ver = nextval('twheel.ver_seq'), owner = NULL,"
    "  lease_until = NULL WHERE ns = p_ns AND key = p_key"
    "  RETURNING ver INTO v;"
    " END IF;"
    " IF p_due < twheel.soon() THEN PERFORM pg_notify('twheel', p_ns);"
    " END IF; RETURN v; END $f$;"
    "CREATE FUNCTION twheel.cancel_if(p_ns text, p_key bytea,"
    " p_expect bytea) RETURNS bigint LANGUAGE plpgsql"
    " SET search_path = pg_catalog AS $f$ DECLARE cur bytea; BEGIN"
    " SELECT payload INTO cur FROM twheel.timers"
    " WHERE ns = p_ns AND key = p_key FOR UPDATE;"
    " IF NOT FOUND THEN RETURN -2; END IF;"
    " IF substring(cur FROM 1 FOR octet_length(p_expect)) <> p_expect"
    " THEN RETURN -1; END IF;"
    " DELETE FROM twheel.timers WHERE ns = p_ns AND key = p_key;"
    " RETURN nextval('twheel.ver_seq'); END $f$;"
    /* restore: -1 when the key is held (pending or dead), else 0. */
    "CREATE FUNCTION twheel.restore(p_ns text, p_key bytea, p_due bigint,"
    " p_payload bytea, p_attempt integer, p_dead boolean) RETURNS bigint"
    " LANGUAGE plpgsql SET search_path = pg_catalog AS $f$"
    " DECLARE v bigint; BEGIN"
    " PERFORM 1 FROM twheel.dead WHERE ns = p_ns AND key = p_key;"
    " IF FOUND THEN RETURN -1; END IF;"
    " PERFORM 1 FROM twheel.timers WHERE ns = p_ns AND key = p_key;"
    " IF FOUND THEN RETURN -1; END IF;"
    " IF p_dead THEN"
    "  INSERT INTO twheel.dead (ns, key, due, payload, attempts)"
    "  VALUES (p_ns, p_key, p_due, p_payload, p_attempt)"
    "  ON CONFLICT DO NOTHING; RETURN 0;"
    " END IF;"
    " INSERT INTO twheel.timers AS t (ns, key, due, payload, attempts)"
    " VALUES (p_ns, p_key, p_due, p_payload, greatest(p_attempt, 1) - 1)"
    " ON CONFLICT DO NOTHING RETURNING t.ver INTO v;"
    " IF v IS NULL THEN RETURN -1; END IF;"
    " IF p_due < twheel.soon() THEN PERFORM pg_notify('twheel', p_ns);"
    " END IF; RETURN 0; END $f$;";

/* What a node needs, in the order open checks it: the first one missing
 * is named. ro: a read-only open needs it too. The functions run with the
 * caller's rights, so the tables' privileges are needed beside them. */
static const char privileges[] =
    "SELECT w FROM (VALUES"
    " (1, true, 'SELECT on twheel.timers',"
    "  has_table_privilege('twheel.timers', 'SELECT')),"
    " (2, false, 'INSERT on twheel.timers',"
    "  has_table_privilege('twheel.timers', 'INSERT')),"
    " (3, false, 'UPDATE on twheel.timers',"
    "  has_table_privilege('twheel.timers', 'UPDATE')),"
    " (4, false, 'DELETE on twheel.timers',"
    "  has_table_privilege('twheel.timers', 'DELETE')),"
    " (5, true, 'SELECT on twheel.dead',"
    "  has_table_privilege('twheel.dead', 'SELECT')),"
    " (6, false, 'INSERT on twheel.dead',"
    "  has_table_privilege('twheel.dead', 'INSERT')),"
    " (7, false, 'UPDATE on twheel.dead',"
    "  has_table_privilege('twheel.dead', 'UPDATE')),"
    " (8, false, 'DELETE on twheel.dead',"
    "  has_table_privilege('twheel.dead', 'DELETE')),"
    " (9, true, 'SELECT on twheel.version',"
    "  has_table_privilege('twheel.version', 'SELECT')),"
    " (16, true, 'SELECT on twheel.quarantine',"
    "  has_table_privilege('twheel.quarantine', 'SELECT')),"
    " (17, false, 'INSERT on twheel.quarantine',"
    "  has_table_privilege('twheel.quarantine', 'INSERT')),"
    " (10, false, 'USAGE on sequence twheel.ver_seq',"
    "  has_sequence_privilege('twheel.ver_seq', 'USAGE')),"
    " (11, false, 'EXECUTE on twheel.schedule(text, bytea, bigint, bytea)',"
    "  has_function_privilege('twheel.schedule(text, bytea, bigint, bytea)',"
    "  'EXECUTE')),"
    " (12, false, 'EXECUTE on twheel.cancel_v(text, bytea)',"
    "  has_function_privilege('twheel.cancel_v(text, bytea)', 'EXECUTE')),"
    " (13, false, 'EXECUTE on twheel.schedule_if(text, bytea, bigint,"
    " bytea, bytea)', has_function_privilege('twheel.schedule_if(text,"
    " bytea, bigint, bytea, bytea)', 'EXECUTE')),"
    " (14, false, 'EXECUTE on twheel.cancel_if(text, bytea, bytea)',"
    "  has_function_privilege('twheel.cancel_if(text, bytea, bytea)',"
    "  'EXECUTE')),"
    " (15, false, 'EXECUTE on twheel.restore(text, bytea, bigint, bytea,"
    " integer, boolean)', has_function_privilege('twheel.restore(text,"
    " bytea, bigint, bytea, integer, boolean)', 'EXECUTE')),"
    " (18, false, 'EXECUTE on twheel.schedule_many(text, bytea[], bigint[],"
    " bytea[])', has_function_privilege('twheel.schedule_many(text,"
    " bytea[], bigint[], bytea[])', 'EXECUTE'))"
    ") v(i, ro, w, ok) WHERE NOT ok AND (ro OR $1 = 0) ORDER BY i LIMIT 1";

/* USAGE on the schema and SELECT on twheel.version, before anything in
 * the schema is named or the version read (either missing is an error
 * there, not a false). */
static int schema_usage(PGconn *c, int ms, char *err, size_t len)
{
    PGresult *r = NULL;
    int rc = tw__pg_exec(
        c, ms,
        "SELECT has_schema_privilege(n.oid, 'USAGE'), coalesce((SELECT"
        " has_table_privilege(t.oid, 'SELECT') FROM pg_class t WHERE"
        " t.relnamespace = n.oid AND t.relname = 'version'), true)"
        " FROM pg_namespace n WHERE n.nspname = 'twheel'",
        NULL, &r);
    if (rc)
        return rc;
    if (PQntuples(r) == 1 && !(tw__pg_bool(r, 0, 0) && tw__pg_bool(r, 0, 1))) {
        snprintf(err, len,
                 "postgres: this role lacks %s (docs/guide/postgres.md)",
                 tw__pg_bool(r, 0, 0) ? "SELECT on twheel.version"
                                      : "USAGE on schema twheel");
        rc = TW_EAUTH;
    }
    PQclear(r);
    return rc;
}

/* Every privilege the node will use (a read-only open: those to read). */
static int check_privileges(PGconn *c, int ms, bool readonly, char *err,
                            size_t len)
{
    struct pgp p;
    tw__pg_p_init(&p);
    tw__pg_p_i32(&p, readonly);
    PGresult *r = NULL;
    int rc = tw__pg_exec(c, ms, privileges, &p, &r);
    if (rc)
        return rc;
    if (PQntuples(r)) {
        snprintf(err, len,
                 "postgres: this role lacks %s (docs/guide/postgres.md)",
                 PQgetvalue(r, 0, 0));
        rc = TW_EAUTH;
    }
    PQclear(r);
    return rc;
}

/* The installed version, 0 when there is no schema; < 0 on an error. */
static int installed(PGconn *c, int ms, int *v)
{
    PGresult *r = NULL;
    int rc = tw__pg_exec(
        c, ms, "SELECT to_regclass('twheel.version') IS NOT NULL", NULL, &r);
    if (rc)
        return rc;
    bool there = tw__pg_bool(r, 0, 0);
    PQclear(r);
    *v = 0;
    if (!there)
        return 0;
    rc = tw__pg_exec(c, ms, "SELECT max(v) FROM twheel.version", NULL, &r);
    if (rc)
        return rc;
    *v = tw__pg_i32(r, 0, 0);
    PQclear(r);
    return 0;
}

/* Under the install lock: install unless there, then check the version. */
static int install_locked(PGconn *c, int ms, bool readonly, char *err,
                          size_t len)
{
    int v = 0;
    int rc = schema_usage(c, ms, err, len);
    if (!rc)
        rc = installed(c, ms, &v);
    if (rc)
        return rc;
    if (!v && readonly) {
        snprintf(err, len, "postgres: no schema twheel in this database");
        return TW_ENOENT;
    }
    if (!v) {
        /* Several statements: the simple query protocol (PQexec). */
        rc = tw__pg_exec_script(c, ms, schema_v1);
        if (rc == TW_EAUTH)
            snprintf(err, len,
                     "postgres: schema twheel missing, and this role may "
                     "not create it (docs/guide/postgres.md)");
        if (rc)
            return rc;
        v = PG_SCHEMA_V;
    }
    if (v != PG_SCHEMA_V) {
        snprintf(err, len,
                 "postgres: schema twheel is version %d; this library "
                 "knows %d",
                 v, PG_SCHEMA_V);
        return TW_EINVAL;
    }
    return 0;
}

int tw__pg_schema(PGconn *c, int ms, bool readonly, char *err, size_t err_len)
{
    char dummy[1] = "";
    if (!err || !err_len) {
        err = dummy;
        err_len = sizeof dummy;
    }
    /* 0x74776865656c: "twheel", the install lock's number. */
    int rc = tw__pg_exec(c, ms, "BEGIN", NULL, NULL);
    if (!rc)
        rc = tw__pg_exec(c, ms, "SELECT pg_advisory_xact_lock(128056201405804)",
                         NULL, NULL);
    if (!rc)
        rc = install_locked(c, ms, readonly, err, err_len);
    if (rc && !err[0] && err != dummy)
        snprintf(err, err_len, "postgres: %s%s",
                 rc == TW_EAUTH ? "this role lacks a privilege on schema "
                                  "twheel (docs/guide/postgres.md): "
                                : "",
                 PQerrorMessage(c));
    int end = tw__pg_exec(c, ms, rc ? "ROLLBACK" : "COMMIT", NULL, NULL);
    rc = rc ? rc : end;
    if (!rc)
        rc = check_privileges(c, ms, readonly, err, err_len);
    if (rc && !err[0] && err != dummy)
        snprintf(err, err_len, "postgres: %s", PQerrorMessage(c));
    for (size_t n = strlen(err);
         n && (err[n - 1] == '\n' || err[n - 1] == ' ');)
        err[--n] = 0;
    return rc;
}
