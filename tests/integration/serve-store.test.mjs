// deploy/olp-local serve --store postgres (issue 25 item 5), as a user runs it, with the
// olp-fcgi under test as OLP_BIN: the first start makes a PostgreSQL cluster in
// $OLP_HOME/postgresql (the distribution's server), starts it, makes the schema with
// olp-keys store init as olp_admin, writes config.json's "store" and "store_passfile"
// (olp_worker, a 0600 passfile) and says so, and prints no password; the workers report
// the store healthy; a key made with olp-keys against that home works; Ctrl-C stops the
// database server too; a second start reuses the cluster, the schema and the key.
//
// No PostgreSQL server installed is a skip (77, deploy/olp-local test installs it).

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';

import { getJSON, olpKeys as harnessOlpKeys, serveRoot, startServe } from './harness.mjs';

const hasPg = spawnSync('sh', ['-c', 'ls /usr/lib/postgresql/*/bin/initdb'], { encoding: 'utf8' }).status === 0;
if (!hasPg) {
  process.stderr.write('it_serve_store: skipped: no PostgreSQL server installed (deploy/olp-local test installs it)\n');
  process.exit(77);
}

const root = serveRoot('olp-serve-store-');
const home = path.join(root, 'home');

// serve --store postgres; the database server runs with its data under OLP_HOME, so
// stop()'s check that nothing naming OLP_HOME is left covers it too.
const serve = () => startServe(home, ['--store', 'postgres'], { upMs: 90000, stopMs: 20000 });
const get = getJSON;
const olpKeys = (...args) => harnessOlpKeys(home, ...args);

describe('deploy/olp-local serve --store postgres', () => {
  let guest;

  it('the first start makes the cluster, the schema and config.json, and says so', async () => {
    const s = await serve();
    try {
      const out = s.out();
      const dir = path.join(home, 'postgresql');
      assert.match(out, /created a PostgreSQL cluster in .*postgresql\/data/);
      assert.match(out, /olp-keys store init: /);
      assert.match(out, /wrote .*config\.json: "store"/);
      const conf = JSON.parse(fs.readFileSync(path.join(home, 'config.json'), 'utf8'));
      assert.match(conf.store, /^postgresql:\/\/olp_worker@127\.0\.0\.1:\d+\/olp$/);
      assert.equal(conf.store_passfile, path.join(dir, 'passfile'));
      const st = fs.statSync(conf.store_passfile);
      assert.equal(st.mode & 0o777, 0o600);
      // The passwords are in the passfile and nowhere serve printed.
      for (const line of fs.readFileSync(conf.store_passfile, 'utf8').trim().split('\n')) {
        const pw = line.split(':').at(-1);
        assert.ok(pw.length >= 16, 'a random password');
        assert.ok(!out.includes(pw), 'serve printed a database password');
      }
      const token = /^ {4}(olp_[A-Za-z0-9_-]+)$/m.exec(out)?.[1];
      assert.ok(token, `no owner token in serve's output:\n${out}`);
      const h = await get(s.port, '/health', token);
      assert.equal(h.status, 200, h.text);
      assert.equal(h.json.store.kind, 'postgresql');
      assert.equal(h.json.store.ok, true, h.text);
      // A key made with olp-keys against this home lives in the database and works.
      guest = olpKeys('keygen', '--name=serve store guest');
      assert.equal((await get(s.port, '/v1/models', guest.token)).status, 200);
      assert.ok(!fs.existsSync(path.join(home, 'keys', guest.id)), 'the key went to key files, not the database');
    } finally {
      await s.stop();
    }
  });

  it('a second start reuses the cluster, the schema, the owner key and the guest key', async () => {
    const s = await serve();
    try {
      const out = s.out();
      assert.doesNotMatch(out, /created a PostgreSQL cluster/);
      assert.match(out, /started the PostgreSQL cluster in /);
      assert.match(out, /Owner credential: the owner key in the PostgreSQL store/);
      assert.equal((await get(s.port, '/v1/models', guest.token)).status, 200);
    } finally {
      await s.stop();
    }
  });
});
