// SPDX-License-Identifier: MIT
// One scripted session of the npm client `jackd` (installed by
// scripts/twheeld-clients.sh) against a beanstalkd-protocol server on
// 127.0.0.1:PORT. Prints one line per step; job ids are printed relative
// to the first one, so two servers' transcripts compare line by line.
// Usage: node session.js PORT JACKD_MODULE_DIR
'use strict';
const Jackd = require(process.argv[3]);

const out = [];
let base = null;
const rel = (id) => 'J' + (Number(id) - base);
const log = (...a) => out.push(a.join(' '));
const pick = (yaml, keys) => {
  const m = {};
  for (const line of String(yaml).split('\n')) {
    const i = line.indexOf(': ');
    if (i > 0) m[line.slice(0, i)] = line.slice(i + 2);
  }
  return keys.map((k) => k + '=' + m[k]).join(' ');
};
const err = async (p) => {
  try {
    return 'ok ' + JSON.stringify(await p);
  } catch (e) {
    return 'error ' + e.message;
  }
};

(async () => {
  const c = new Jackd();
  await c.connect({ host: '127.0.0.1', port: Number(process.argv[2]) });
  log('use', await c.use('js-tube'));
  log('watch', await c.watch('js-tube'));
  log('ignore', await c.ignore('default'));
  const a = await c.put('alpha', { priority: 10, ttr: 5 });
  base = Number(a);
  log('put', rel(a));
  const b = await c.put('beta', { priority: 5, delay: 2, ttr: 5 });
  log('put delayed', rel(b));
  const pd = await c.peekDelayed();
  log('peek-delayed', rel(pd.id), pd.payload.toString());
  log('stats-job', pick(await c.statsJob(b),
    ['state', 'pri', 'delay', 'ttr', 'tube']));
  let j = await c.reserve();
  log('reserve', rel(j.id), j.payload.toString());
  log('stats-job', pick(await c.statsJob(j.id),
    ['state', 'pri', 'ttr', 'reserves']));
  log('touch', await err(c.touch(j.id)));
  log('release', await err(c.release(j.id, { priority: 20, delay: 0 })));
  j = await c.reserveWithTimeout(1);
  log('reserve-with-timeout', rel(j.id), j.payload.toString());
  log('bury', await err(c.bury(j.id, 30)));
  const pb = await c.peekBuried();
  log('peek-buried', rel(pb.id), pb.payload.toString());
  log('kick', await c.kick(10));
  log('stats-job', pick(await c.statsJob(j.id),
    ['state', 'pri', 'reserves', 'releases', 'buries', 'kicks']));
  log('delete', await err(c.delete(j.id)));
  log('delete again', await err(c.delete(j.id)));
  j = await c.reserveWithTimeout(4); // beta, once its delay has passed
  log('reserve-with-timeout', rel(j.id), j.payload.toString());
  log('delete', await err(c.delete(j.id)));
  log('reserve-with-timeout 0', await err(c.reserveWithTimeout(0)));
  log('kick-job', await err(c.kickJob(j.id)));
  log('stats-tube', pick(await c.statsTube('js-tube'),
    ['name', 'current-jobs-ready', 'current-jobs-buried', 'total-jobs',
      'current-using', 'current-watching', 'cmd-delete']));
  log('stats', pick(await c.stats(),
    ['current-jobs-ready', 'current-jobs-buried', 'current-jobs-delayed',
      'cmd-put', 'cmd-bury', 'cmd-kick', 'cmd-touch', 'cmd-release',
      'cmd-delete', 'total-jobs', 'current-tubes']));
  log('list-tubes-watched', JSON.stringify(await c.listTubesWatched()));
  log('list-tube-used', await c.getCurrentTube());
  log('stats-tube missing', await err(c.statsTube('nosuch')));
  await c.disconnect();
  console.log(out.join('\n'));
})().catch((e) => {
  console.log(out.join('\n'));
  console.log('FAILED', e && e.stack ? e.stack : e);
  process.exit(1);
});
