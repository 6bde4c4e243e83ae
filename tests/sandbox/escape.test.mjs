// Escape tests: olp-probe tries, from inside the sandbox, everything a hostile prompt
// could make a provider client do (tests/sandbox/escape.c), run through olp-sandbox with
// exactly the server's policy. Run as root and, when possible, as www-data — the account
// lighttpd workers usually run as. Any check that reports ok:false fails the test.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

const SANDBOX = process.env.OLP_SANDBOX;
const PROBE = process.env.OLP_PROBE;
const STUB = process.env.OLP_SANDBOX_EXEC;
assert.ok(SANDBOX && PROBE && STUB, 'OLP_SANDBOX, OLP_PROBE and OLP_SANDBOX_EXEC must be set');

const secret = 'olp-escape-secret-' + Math.random().toString(36).slice(2);
const root = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-escape-'));
fs.chmodSync(root, 0o755);
// A key store laid out as the real one, holding bytes we can look for.
const home = path.join(root, 'olp-home');
const keyDir = path.join(home, 'keys', 'abcd1234');
fs.mkdirSync(keyDir, { recursive: true, mode: 0o700 });
const keyFile = path.join(keyDir, 'manifest.json');
const manifest = JSON.stringify({ schema_version: 1, id: 'abcd1234', token_hash: 'MANIFEST-' + secret });
fs.writeFileSync(keyFile, manifest, { mode: 0o600 });

let unixServer, tcpServer, tcpPort, shmid = -1;
const unixPath = path.join(root, 'host.sock');

test.before(async () => {
  unixServer = net.createServer((c) => c.end('host-unix-socket\n'));
  await new Promise((r) => unixServer.listen(unixPath, r));
  tcpServer = net.createServer((c) => c.end('host-tcp\n'));
  await new Promise((r) => tcpServer.listen(0, '127.0.0.1', r));
  tcpPort = tcpServer.address().port;
  const out = execFileSync('ipcmk', ['-M', '4096'], { encoding: 'utf8' });
  shmid = Number(/(\d+)/.exec(out)[1]);
});

test.after(() => {
  unixServer?.close();
  tcpServer?.close();
  if (shmid >= 0) spawnSync('ipcrm', ['-m', String(shmid)]);
  fs.rmSync(root, { recursive: true, force: true });
});

// The identities to run as: ourselves, and www-data when we are root and it exists.
function identities() {
  const ids = [{ name: os.userInfo().username, uid: process.getuid(), wrap: [],
    bins: { sandbox: SANDBOX, probe: PROBE, stub: STUB } }];
  if (process.getuid() === 0 && spawnSync('id', ['-u', 'www-data']).status === 0) {
    // www-data cannot necessarily read the build tree: give it its own copies.
    const bin = path.join(root, 'bin');
    fs.mkdirSync(bin, { recursive: true, mode: 0o755 });
    for (const f of [SANDBOX, PROBE, STUB]) {
      fs.copyFileSync(f, path.join(bin, path.basename(f)));
      fs.chmodSync(path.join(bin, path.basename(f)), 0o755);
    }
    const copy = (f) => path.join(bin, path.basename(f));
    ids.push({
      name: 'www-data',
      uid: Number(spawnSync('id', ['-u', 'www-data'], { encoding: 'utf8' }).stdout),
      wrap: ['runuser', '-u', 'www-data', '--'],
      bins: { sandbox: copy(SANDBOX), probe: copy(PROBE), stub: copy(STUB) },
    });
  }
  return ids;
}

function runtimeFor(id) {
  const dir = path.join(root, 'run-' + id.name);
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  if (id.wrap.length) execFileSync('chown', ['www-data:www-data', dir]);
  return dir;
}

// The command line and environment of olp-sandbox [opts] -- probe args, as id.
function sandboxArgv(id, opts, args, extraEnv = {}) {
  const [cmd, ...pre] = id.wrap.length ? id.wrap : [id.bins.sandbox];
  const argv = id.wrap.length ? [...pre, id.bins.sandbox] : [];
  return {
    cmd,
    argv: [...argv, '--runtime-dir', runtimeFor(id), ...opts, '--', id.bins.probe, ...args],
    env: { ...process.env, OLP_ESCAPE_SECRET: secret, OLP_SANDBOX_EXEC: id.bins.stub, ...extraEnv },
  };
}

// Run olp-sandbox [opts] -- probe args as id; returns {status, stdout, stderr, ms}.
function sandboxed(id, opts, args, extraEnv = {}) {
  const { cmd, argv, env } = sandboxArgv(id, opts, args, extraEnv);
  const t0 = Date.now();
  const r = spawnSync(cmd, argv, {
    encoding: 'utf8',
    // stdin from /dev/null: node's default stdin pipe is a unix socketpair, and
    // olp-sandbox hands its own stdin to the command.
    stdio: ['ignore', 'pipe', 'pipe'],
    env,
    timeout: 90_000,
  });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr, ms: Date.now() - t0 };
}

// Start olp-sandbox [opts] -- probe args as id in the background.
function sandboxedAsync(id, opts, args) {
  const { cmd, argv, env } = sandboxArgv(id, opts, args);
  return spawn(cmd, argv, { stdio: ['ignore', 'pipe', 'pipe'], env });
}

async function waitFor(pred, ms) {
  for (const end = Date.now() + ms; Date.now() < end; await new Promise((r) => setTimeout(r, 200)))
    if (pred()) return true;
  return pred();
}

function probesAlive(word) {
  const r = spawnSync('pgrep', ['-f', `olp-probe ${word}`], { encoding: 'utf8' });
  return r.stdout.trim().split('\n').filter(Boolean).length;
}

for (const id of identities()) {
  test(`escape checks as ${id.name}`, () => {
    const hex = Buffer.from(secret).toString('hex');
    const r = sandboxed(id, [], ['escape', '--keyfile', keyFile, '--keydir', path.join(home, 'keys'),
      '--runtime', runtimeFor(id), '--hostpid', String(process.pid), '--unix', unixPath,
      '--tcp', `127.0.0.1:${tcpPort}`, '--shmid', String(shmid), '--secret-hex', hex,
      '--worker-uid', String(id.uid)]);
    const lines = r.stdout.trim().split('\n').map((l) => JSON.parse(l));
    const checks = lines.filter((l) => l.check);
    const failed = checks.filter((c) => !c.ok);
    assert.deepEqual(failed, [], 'escapes found:\n' + failed.map((c) => `${c.check}: ${c.detail}`).join('\n'));
    // Every group of the list ran (a probe that stopped early proves nothing).
    for (const name of ['keystore_file', 'keystore_via_proc1_root', 'keystore_via_dotdot',
      'keystore_via_planted_symlink', 'root_ssh', 'other_scratch_dirs', 'env_allowlisted',
      'secret_not_in_proc', 'only_fds_0_1_2', 'fd0_not_socket', 'only_sandbox_pids',
      'host_pid_not_signalable', 'ptrace_attach', 'process_vm_readv', 'proc1_mem_write',
      'unshare_user', 'clone3_enosys', 'mount_tmpfs', 'keyctl', 'bpf', 'io_uring_setup',
      'userfaultfd', 'perf_event_open', 'socket_af_unix', 'host_unix_socket_absent',
      'tcp_to_host_fails', 'udp_to_resolver_fails', 'tiocsti', 'host_shm_invisible',
      'status_CapEff', 'status_CapPrm', 'status_CapBnd', 'status_NoNewPrivs', 'status_Seccomp',
      'usr_read_only', 'root_read_only', 'etc_read_only', 'dev_read_only', 'tmp_size_limited',
      'dev_shm_size_limited', 'sys_absent', 'etc_ssl_private_absent', 'home_size_limited',
      'proc_knob_core_pattern', 'proc_knob_printk_ratelimit_burst', 'proc_knob_ip_forward',
      'proc_knob_sysrq-trigger', 'proc_nothing_host_writable', 'run_uid_not_host_root',
      'run_uid_not_worker', 'mountinfo_no_runtime_dir']) {
      assert.ok(checks.some((c) => c.check === name), `check ${name} did not run`);
    }
    assert.equal(r.status, 0, r.stderr);
    assert.ok(!r.stdout.includes('MANIFEST-'), 'key store bytes leaked');
  });

  // Loopback mode (issue 12): a namespace with only lo and a listener the probe is not
  // told about; every escape check holds the same, the network ones included.
  test(`escape checks in loopback network mode as ${id.name}`, () => {
    const hex = Buffer.from(secret).toString('hex');
    const r = sandboxed(id, ['--network', 'loopback:18080'], ['escape', '--keyfile', keyFile,
      '--keydir', path.join(home, 'keys'), '--runtime', runtimeFor(id),
      '--hostpid', String(process.pid), '--unix', unixPath, '--tcp', `127.0.0.1:${tcpPort}`,
      '--shmid', String(shmid), '--secret-hex', hex, '--worker-uid', String(id.uid)]);
    const checks = r.stdout.trim().split('\n').map((l) => JSON.parse(l)).filter((l) => l.check);
    const failed = checks.filter((c) => !c.ok);
    assert.deepEqual(failed, [], 'escapes found:\n' + failed.map((c) => `${c.check}: ${c.detail}`).join('\n'));
    for (const name of ['tcp_to_host_fails', 'udp_to_resolver_fails', 'no_route_out',
      'only_fds_0_1_2', 'fd0_not_socket', 'host_unix_socket_absent', 'status_Seccomp']) {
      assert.ok(checks.some((c) => c.check === name), `check ${name} did not run`);
    }
    assert.match(r.stderr, /listener: 127\.0\.0\.1:18080/);
    assert.equal(r.status, 0, r.stderr);
  });

  // The probe itself never starts more than 1,200 processes, whatever the sandbox does:
  // a broken limit must not take the host's pid space.
  test(`a fork-hold of 3000 stops below 1000 and leaves nothing behind (${id.name})`, async () => {
    const r = sandboxed(id, ['--timeout', '20'], ['forkhold', '3000', '1']);
    assert.equal(r.status, 0, r.stderr);
    const m = JSON.parse(r.stdout.trim().split('\n').pop());
    assert.ok(m.forkhold >= 100, `the probe never got going: ${r.stdout}`);
    assert.ok(m.forkhold < 1000, `${m.forkhold} processes: the process budget did not hold`);
    assert.match(m.stopped_by, /Resource temporarily unavailable/);
    assert.ok(await waitFor(() => probesAlive('forkhold') === 0, 90_000),
      `processes left behind: ${probesAlive('forkhold')}`);
  });

  test(`one run holding its whole process budget leaves others theirs (${id.name})`, async () => {
    const a = sandboxedAsync(id, ['--timeout', '30'], ['forkhold', '3000', '8']);
    const line = await new Promise((resolve) => a.stdout.once('data', (d) => resolve(String(d))));
    const held = JSON.parse(line.trim().split('\n')[0]);
    assert.match(held.stopped_by, /Resource temporarily unavailable/, 'the hoarder is at its budget');
    // While it holds them: another run starts, and forks too.
    const b = sandboxed(id, [], ['forkhold', '20', '0']);
    assert.equal(b.status, 0, b.stderr);
    assert.equal(JSON.parse(b.stdout.trim()).forkhold, 20, b.stdout);
    a.kill('SIGTERM');
    await new Promise((resolve) => a.on('exit', resolve));
  });

  test(`a disk filler stops at the run's budget (${id.name})`, () => {
    const r = sandboxed(id, ['--disk-mb', '64'], ['fill', '/home/olp/fill']);
    assert.equal(r.status, 0, r.stderr);
    const m = JSON.parse(r.stdout.trim());
    assert.equal(m.stopped_by, 'No space left on device', r.stdout);
    assert.ok(m.filled_mib <= 48, `${m.filled_mib} MiB written into a 48 MiB home`);
  });

  test(`a memory hog is stopped (${id.name})`, () => {
    const r = sandboxed(id, ['--as-mb', '512'], ['hog']);
    assert.equal(r.status, 3, r.stderr);
    const m = /"hog_stopped_at_mib":(\d+)/.exec(r.stdout);
    assert.ok(m && Number(m[1]) < 512, 'stopped below the address-space limit: ' + r.stdout);
  });

  test(`a sleeper past its timeout is killed with its children (${id.name})`, async () => {
    const r = sandboxed(id, ['--timeout', '0.5'], ['spin']);
    assert.equal(r.status, 124);
    assert.ok(r.ms < 10_000, `took ${r.ms} ms`);
    // olp-sandbox answers first and leaves the teardown to a child of its own (SIGKILL
    // was sent; a slow build, such as the sanitizers', may still be reaping).
    assert.ok(await waitFor(() => probesAlive('spin') === 0, 5000), `left: ${probesAlive('spin')}`);
  });

  test(`Ctrl-C stops the run, its tree and its scratch dir (${id.name})`, async () => {
    // A signal to olp-sandbox itself (runuser stands between us and it for www-data; the
    // run is the same, so once is enough).
    if (id.wrap.length) return;
    const rt = path.join(root, 'run-ctrl-c');
    fs.mkdirSync(rt, { recursive: true, mode: 0o700 });
    const a = spawn(id.bins.sandbox, ['--runtime-dir', rt, '--', id.bins.probe, 'spin'],
      { stdio: ['ignore', 'pipe', 'pipe'] });
    await new Promise((resolve) => a.stdout.once('data', resolve)); // spinning, with a grandchild
    const exited = new Promise((resolve) => a.on('exit', (code, sig) => resolve({ code, sig })));
    a.kill('SIGINT');
    const { code, sig } = await exited;
    assert.equal(sig, null, 'olp-sandbox itself died of the signal');
    assert.equal(code, 130);
    assert.ok(await waitFor(() => probesAlive('spin') === 0, 5000), 'the probe survived Ctrl-C');
    assert.ok(await waitFor(() => fs.readdirSync(rt).length === 0, 5000),
      `left in the runtime dir: ${fs.readdirSync(rt)}`);
  });

  test(`two sandboxes cannot see each other's /tmp or processes (${id.name})`, async () => {
    const [cmd, ...pre] = id.wrap.length ? id.wrap : [id.bins.sandbox];
    const argv = id.wrap.length ? [...pre, id.bins.sandbox] : [];
    const marker = 'marker-' + process.pid;
    const a = spawn(cmd, [...argv, '--runtime-dir', runtimeFor(id), '--', id.bins.probe, 'mark', marker],
      { stdio: ['ignore', 'pipe', 'pipe'] });
    await new Promise((resolve) => a.stdout.once('data', resolve)); // marked, now sleeping
    const b = sandboxed(id, [], ['peek', marker]);
    const seen = JSON.parse(b.stdout);
    assert.equal(seen.other_tmp_visible, false);
    assert.equal(seen.other_probes_visible, 0);
    await new Promise((resolve) => a.on('exit', resolve));
  });

  // Where runs cannot get a uid of their own, nothing runs (fail closed), and the doctor
  // says why.
  test(`no uid of its own, no run (${id.name})`, () => {
    const r = sandboxed(id, ['--uid-range', '0:65536'], ['fds']);
    assert.equal(r.status, 125, r.stdout + r.stderr);
    assert.equal(r.stdout, '');
    const { cmd, argv, env } = sandboxArgv(id, ['--uid-range', '0:65536'], []);
    const d = spawnSync(cmd, [...argv.slice(0, argv.lastIndexOf('--')), '--doctor'], { encoding: 'utf8', env });
    assert.equal(d.status, 1);
    assert.match(d.stdout, /identity +FAIL +unavailable: uid range 0:65536/);
  });

  test(`the shared identity is refused to root, reported otherwise (${id.name})`, () => {
    const r = sandboxed(id, ['--identity', 'shared'], ['fds']);
    if (id.uid === 0) {
      assert.equal(r.status, 125, r.stdout + r.stderr);
    } else {
      assert.equal(r.status, 0, r.stderr);
      assert.equal(r.stdout.trim(), '{"fds":[0,1,2],"fd0_socket":false}');
    }
  });
}
