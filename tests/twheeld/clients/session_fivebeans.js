// SPDX-License-Identifier: MIT
// One scripted session of the npm client `fivebeans` (installed by
// scripts/twheeld-clients.sh) against a beanstalkd-protocol server on
// 127.0.0.1:PORT. fivebeans writes each command at once and matches the
// replies in order, so commands issued together are pipelined: the session
// does that too. Prints one line per step; job ids are printed relative to
// the first one, so two servers' transcripts compare line by line.
// Usage: node --no-deprecation session_fivebeans.js PORT FIVEBEANS_DIR
'use strict';
const fivebeans = require(process.argv[3]);

const out = [];
let base = null;
const rel = (id) => 'J' + (Number(id) - base);
const log = (...a) => out.push(a.join(' '));
const pick = (m, keys) => keys.map((k) => k + '=' + m[k]).join(' ');

(async () => {
  const c = new fivebeans.client('127.0.0.1', Number(process.argv[2]));
  await new Promise((resolve, reject) => {
    c.once('connect', resolve);
    c.once('error', reject);
    c.connect();
  });
  // call('put', 10, 0, 5, 'x') resolves to the callback's results (an
  // array) or to 'error <reply word>'.
  const call = (cmd, ...args) => new Promise((resolve) => {
    c[cmd](...args, (err, ...res) => resolve(err ? ['error ' + err] : res));
  });
  log('use', await call('use', 'fb-tube'));
  log('watch', await call('watch', 'fb-tube'));
  log('ignore', await call('ignore', 'default'));
  const [a] = await call('put', 10, 0, 5, 'alpha');
  base = Number(a);
  log('put', rel(a));
  const [b] = await call('put', 5, 2, 5, 'beta');
  log('put delayed', rel(b));
  const pd = await call('peek_delayed');
  log('peek-delayed', rel(pd[0]), pd[1].toString());
  log('stats-job', pick((await call('stats_job', b))[0],
    ['state', 'pri', 'delay', 'ttr', 'tube']));
  // Three puts, a peek-ready and a stats-tube pipelined in one go.
  const piped = await Promise.all([
    call('put', 20, 0, 5, 'gamma'), call('put', 20, 0, 5, 'delta'),
    call('put', 1, 0, 5, 'epsilon'), call('peek_ready'),
    call('stats_tube', 'fb-tube')]);
  log('pipelined puts', piped.slice(0, 3).map((r) => rel(r[0])).join(' '));
  log('pipelined peek-ready', rel(piped[3][0]), piped[3][1].toString());
  log('pipelined stats-tube', pick(piped[4][0],
    ['name', 'current-jobs-ready', 'current-jobs-delayed', 'total-jobs']));
  let j = await call('reserve');
  log('reserve', rel(j[0]), j[1].toString());
  log('delete', await call('destroy', j[0]));
  j = await call('reserve');
  log('reserve', rel(j[0]), j[1].toString());
  log('stats-job', pick((await call('stats_job', j[0]))[0],
    ['state', 'pri', 'ttr', 'reserves']));
  log('touch', await call('touch', j[0]));
  log('release', await call('release', j[0], 30, 0));
  j = await call('reserve_with_timeout', 1);
  log('reserve-with-timeout', rel(j[0]), j[1].toString());
  log('bury', await call('bury', j[0], 40));
  const pb = await call('peek_buried');
  log('peek-buried', rel(pb[0]), pb[1].toString());
  log('kick-job', await call('kick_job', j[0]));
  log('kick-job again', await call('kick_job', j[0]));
  log('stats-job', pick((await call('stats_job', j[0]))[0],
    ['state', 'pri', 'reserves', 'releases', 'buries', 'kicks']));
  // Reserve and delete the two of priority 20 (and alpha), pipelined.
  const rs = await Promise.all([call('reserve_with_timeout', 0),
    call('reserve_with_timeout', 0), call('reserve_with_timeout', 0)]);
  log('pipelined reserves', rs.map((r) => rel(r[0]) + ':' + r[1]).join(' '));
  log('pipelined deletes', JSON.stringify(await Promise.all(
    rs.map((r) => call('destroy', r[0])))));
  log('delete again', await call('destroy', rs[0][0]));
  j = await call('reserve_with_timeout', 4); // beta, once its delay passed
  log('reserve-with-timeout', rel(j[0]), j[1].toString());
  log('delete', await call('destroy', j[0]));
  log('reserve-with-timeout 0', await call('reserve_with_timeout', 0));
  log('peek', await call('peek', j[0]));
  log('pause-tube', await call('pause_tube', 'fb-tube', 1));
  log('stats-tube', pick((await call('stats_tube', 'fb-tube'))[0],
    ['name', 'current-jobs-ready', 'current-jobs-buried', 'total-jobs',
      'current-using', 'current-watching', 'cmd-delete', 'pause']));
  log('stats', pick((await call('stats'))[0],
    ['current-jobs-ready', 'current-jobs-buried', 'current-jobs-delayed',
      'cmd-put', 'cmd-bury', 'cmd-kick', 'cmd-touch', 'cmd-release',
      'cmd-delete', 'cmd-peek', 'total-jobs', 'current-tubes']));
  log('list-tubes-watched', JSON.stringify(
    (await call('list_tubes_watched'))[0]));
  log('list-tube-used', await call('list_tube_used'));
  log('list-tubes', JSON.stringify((await call('list_tubes'))[0].sort()));
  log('stats-tube missing', await call('stats_tube', 'nosuch'));
  c.end();
  console.log(out.join('\n'));
})().catch((e) => {
  console.log(out.join('\n'));
  console.log('FAILED', e && e.stack ? e.stack : e);
  process.exit(1);
});
