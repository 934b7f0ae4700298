// SPDX-License-Identifier: MIT
// peer.js - the Node peers of scripts/bench_pg.sh, graphile-worker and
// pg-boss at the versions package-lock.json pins, each driven through its
// own client API on the same PostgreSQL server as twheel:
//   gw    graphile-worker: WorkerUtils.addJob(id, payload, {runAt}) one a
//         transaction, addJobs([...]) for 32 (one statement); fired by
//         run() with its default pollInterval (2000 ms) unless POLL_MS
//   boss  pg-boss: send(name, data, {startAfter}) one a transaction,
//         insert([...]) for 32 (one statement); fired by work() polling
//         every 0.5 s (pollingIntervalSeconds' least value; the default
//         is 2 s) with batchSize 2000 (the default, 1 a poll, cannot
//         deliver 2,000/s)
// Usage:
//   node peer.js rate SYS URL SECONDS CELL...   CELL = CONNSxPER_TX
//     one line a cell: "pgrate sys=S conns=C per_tx=P timers=N secs=T
//     rate=R" (timers due in an hour, so nothing fires)
//   node peer.js fire SYS URL PMPID RATE SECONDS LEAD_MS DRAIN_MS
//     schedules RATE timers a second for SECONDS, each due LEAD_MS after
//     its batch is sent, in batches of 32 every 16 ms (at once when
//     behind), while the worker of the same process fires them, waiting
//     at most DRAIN_MS past the last due time; prints "pgfire sys=S
//     timers=N fed_per_s=F delivered=D p50_ms= p99_ms= max_ms= db_cpu_s= db_us_per_timer="
//     (the server's CPU, all its processes, from /proc: PMPID is the
//     postmaster)
//   node peer.js load SYS URL N   N timers due in an hour (for the sizes)
'use strict';
const fs = require('fs');
const { performance } = require('perf_hooks');

const now = () => performance.timeOrigin + performance.now();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const HOUR = 3600 * 1000;
const QUEUE = 'bench';

// The server's CPU so far in s: the postmaster's own and its reaped
// children's (utime, stime, cutime, cstime) plus every live child's.
function dbCpu(pm) {
  const hz = 100; // USER_HZ on Linux
  const fields = (pid) => {
    const s = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return s.slice(s.lastIndexOf(')') + 2).split(' ');
  };
  const f = fields(pm);
  let t = (+f[11] + +f[12] + +f[13] + +f[14]) / hz;
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const c = fields(d);
      if (+c[1] === +pm) t += (+c[11] + +c[12]) / hz;
    } catch (e) { /* gone meanwhile */ }
  }
  return t;
}

async function gwOpen(url, conns) {
  const { Pool } = require('pg');
  const gw = require('graphile-worker');
  const pool = new Pool({ connectionString: url, max: conns });
  pool.on('error', (e) => console.error('pg:', e.message));
  pool.on('connect', (c) => c.on('error', (e) => console.error('pg:', e.message)));
  await gw.runMigrations({ pgPool: pool, logger: quietGw() });
  const utils = await gw.makeWorkerUtils({ pgPool: pool, logger: quietGw() });
  return {
    one: (d, i) => utils.addJob(QUEUE, { d, i }, { runAt: new Date(d) }),
    many: (ds, i) => utils.addJobs(ds.map((d, j) => ({
      identifier: QUEUE, payload: { d, i: i + j }, runAt: new Date(d)
    }))),
    close: async () => { await utils.release(); await pool.end(); },
    pool, gw
  };
}

function quietGw() {
  const { Logger } = require('graphile-worker');
  return new Logger(() => (level, msg) => {
    if (level === 'error') console.error(msg);
  });
}

async function bossOpen(url, conns) {
  const PgBoss = require('pg-boss');
  const boss = new PgBoss({ connectionString: url, max: conns });
  boss.on('error', (e) => console.error('pg-boss:', e.message));
  await boss.start();
  await boss.createQueue(QUEUE);
  return {
    one: (d, i) => boss.send(QUEUE, { d, i }, { startAfter: new Date(d) }),
    many: (ds, i) => boss.insert(ds.map((d, j) => ({
      name: QUEUE, data: { d, i: i + j }, startAfter: new Date(d).toISOString()
    }))),
    close: () => boss.stop({ graceful: false, wait: true }),
    boss
  };
}

const open = (sys, url, conns) =>
  sys === 'gw' ? gwOpen(url, conns) : bossOpen(url, conns);

// One cell: conns loops, each scheduling perTx timers a transaction.
async function rateCell(sys, sched, secs, conns, perTx) {
  let n = 0;
  let seq = 0;
  // One schedule a connection first, not counted: the pool's connections
  // are made before the clock starts.
  await Promise.all(Array.from({ length: conns }, () => sched.one(Date.now() + HOUR, -1)));
  const t0 = now();
  const end = t0 + secs * 1000;
  const loop = async () => {
    while (now() < end) {
      const d = Date.now() + HOUR;
      if (perTx === 1) await sched.one(d, seq++);
      else {
        const i = seq;
        seq += perTx;
        await sched.many(new Array(perTx).fill(d), i);
      }
      n += perTx;
    }
  };
  await Promise.all(Array.from({ length: conns }, loop));
  const t = (now() - t0) / 1000;
  console.log(`pgrate sys=${sys}-node conns=${conns} per_tx=${perTx}` +
    ` timers=${n} secs=${t.toFixed(3)} rate=${Math.round(n / t)}`);
}

async function rate(sys, url, secs, cells) {
  const parsed = cells.map((c) => c.split('x').map(Number));
  const sched = await open(sys, url, Math.max(...parsed.map((c) => c[0])));
  for (const [conns, perTx] of parsed)
    await rateCell(sys, sched, secs, conns, perTx);
  await sched.close();
}

function pct(a, p) {
  if (!a.length) return 0;
  return a[Math.min(a.length - 1, Math.floor(a.length * p))];
}

// Start the worker of sys; onJob(dueMs) for every job it runs.
async function startWorker(sys, sched, url, onJob) {
  if (sys === 'gw') {
    const opts = {
      pgPool: sched.pool, concurrency: 10, noHandleSignals: true,
      logger: quietGw(), taskList: { [QUEUE]: async (p) => onJob(p.d) }
    };
    if (process.env.POLL_MS) opts.pollInterval = +process.env.POLL_MS;
    const runner = await sched.gw.run(opts);
    return () => runner.stop();
  }
  await sched.boss.work(QUEUE, { pollingIntervalSeconds: 0.5, batchSize: 2000 },
    async (jobs) => { for (const j of jobs) onJob(j.data.d); });
  return () => sched.boss.offWork(QUEUE);
}

async function fire(sys, url, pm, perSec, secs, lead, drain) {
  const sched = await open(sys, url, 12);
  const late = [];
  const total = Math.round(perSec * secs);
  let sent = 0;
  const stop = await startWorker(sys, sched, url, (d) => late.push(now() - d));
  const c0 = dbCpu(pm);
  const t0 = now();
  const every = 32 * 1000 / perSec; // ms between batches of 32
  for (let k = 0; sent < total; k++) {
    const at = t0 + k * every;
    const w = at - now();
    if (w > 0) await sleep(w);
    const m = Math.min(32, total - sent);
    const base = Date.now() + lead;
    const ds = Array.from({ length: m }, (_, j) => base + j);
    await sched.many(ds, sent);
    sent += m;
  }
  const fed = total * 1000 / (now() - t0);
  // Every timer delivered, or drain ms past the last one's due time.
  const last = now() + lead + drain;
  while (late.length < total && now() < last) await sleep(5);
  const cpu = dbCpu(pm) - c0;
  await stop();
  await sched.close();
  late.sort((a, b) => a - b);
  console.log(`pgfire sys=${sys}${process.env.POLL_MS ? '-poll' + process.env.POLL_MS : ''}` +
    ` timers=${total} fed_per_s=${Math.round(fed)} delivered=${late.length}` +
    ` p50_ms=${pct(late, 0.5).toFixed(2)} p99_ms=${pct(late, 0.99).toFixed(2)}` +
    ` max_ms=${(late[late.length - 1] || 0).toFixed(2)} db_cpu_s=${cpu.toFixed(2)}` +
    ` db_us_per_timer=${late.length ? (cpu * 1e6 / late.length).toFixed(1) : 0}`);
}

async function load(sys, url, n) {
  const sched = await open(sys, url, 1);
  const d = Date.now() + HOUR;
  for (let i = 0; i < n; i += 32)
    await sched.many(new Array(Math.min(32, n - i)).fill(d), i);
  await sched.close();
}

async function main() {
  const [verb, sys, url, ...rest] = process.argv.slice(2);
  if (!['gw', 'boss'].includes(sys)) throw new Error(`unknown system ${sys}`);
  if (verb === 'rate') return rate(sys, url, +rest[0], rest.slice(1));
  if (verb === 'fire') return fire(sys, url, +rest[0], +rest[1], +rest[2], +rest[3], +rest[4]);
  if (verb === 'load') return load(sys, url, +rest[0]);
  throw new Error('usage: peer.js rate|fire|load SYS URL ...');
}

main().then(() => process.exit(0), (e) => {
  console.error(`peer.js: ${e.stack || e}`);
  process.exit(1);
});
