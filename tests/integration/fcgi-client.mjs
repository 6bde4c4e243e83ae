// A FastCGI client (the FastCGI 1.0 specification): one request to one worker's own
// socket, as the web server would send it, so that a test reaches a chosen worker
// process instead of the one the web server's balancing picks. Only what olp-fcgi reads:
// a RESPONDER request, its params, its body; the answer's CGI headers and body.
import fs from 'node:fs';
import net from 'node:net';

const VERSION = 1;
const BEGIN_REQUEST = 1;
const END_REQUEST = 3;
const PARAMS = 4;
const STDIN = 5;
const STDOUT = 6;
const STDERR = 7;
const RESPONDER = 1;
const MAX_CONTENT = 0xffff;

function record(type, id, content = Buffer.alloc(0)) {
  const out = [];
  for (let off = 0; off === 0 || off < content.length; off += MAX_CONTENT) {
    const part = content.subarray(off, off + MAX_CONTENT);
    const head = Buffer.from([VERSION, type, id >> 8, id & 0xff, part.length >> 8, part.length & 0xff, 0, 0]);
    out.push(head, part);
    if (!content.length) break;
  }
  return Buffer.concat(out);
}

function nvLength(n) {
  if (n < 128) return Buffer.from([n]);
  const b = Buffer.alloc(4);
  b.writeUInt32BE((n | 0x80000000) >>> 0);
  return b;
}

function encodeParams(params) {
  const parts = [];
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined || v === null) continue;
    const kb = Buffer.from(k, 'latin1');
    const vb = Buffer.from(String(v), 'latin1');
    parts.push(nvLength(kb.length), nvLength(vb.length), kb, vb);
  }
  return Buffer.concat(parts);
}

// The CGI answer: "Status: 200 OK" (200 when absent), headers, a blank line, the body.
function parseCgi(buf) {
  let end = buf.indexOf('\r\n\r\n');
  let sep = 4;
  if (end < 0) {
    end = buf.indexOf('\n\n');
    sep = 2;
  }
  if (end < 0) throw new Error(`no header block in the FastCGI answer: ${buf.toString().slice(0, 200)}`);
  const headers = new Headers();
  let status = 200;
  for (const l of buf.subarray(0, end).toString('latin1').split(/\r?\n/)) {
    const i = l.indexOf(':');
    if (i < 0) continue;
    const k = l.slice(0, i).trim();
    const v = l.slice(i + 1).trim();
    if (k.toLowerCase() === 'status') status = Number(v.split(' ')[0]);
    else headers.append(k, v);
  }
  return { status, headers, body: buf.subarray(end + sep) };
}

// The records of one request (id; flags 1: FCGI_KEEP_CONN) as the web server sends them.
function requestRecords(id, flags, { method = 'GET', uri = '/', headers = {}, body } = {}) {
  const bodyBuf = body === undefined ? Buffer.alloc(0) : Buffer.isBuffer(body) ? body : Buffer.from(body);
  const [pathPart, query = ''] = uri.split('?');
  const params = {
    GATEWAY_INTERFACE: 'CGI/1.1',
    SERVER_PROTOCOL: 'HTTP/1.1',
    SERVER_SOFTWARE: 'olp-it-fcgi-client',
    REQUEST_METHOD: method,
    REQUEST_URI: uri,
    SCRIPT_NAME: '',
    PATH_INFO: pathPart,
    QUERY_STRING: query,
    REMOTE_ADDR: '127.0.0.1',
    REMOTE_PORT: '1',
    SERVER_ADDR: '127.0.0.1',
    SERVER_PORT: '80',
    SERVER_NAME: 'localhost',
  };
  if (body !== undefined) params.CONTENT_LENGTH = String(bodyBuf.length);
  for (const [k, v] of Object.entries(headers)) {
    const name = k.toLowerCase();
    if (name === 'content-type') params.CONTENT_TYPE = v;
    else if (name === 'content-length') params.CONTENT_LENGTH = v;
    else params[`HTTP_${name.toUpperCase().replace(/-/g, '_')}`] = v;
  }
  const begin = Buffer.from([0, RESPONDER, flags, 0, 0, 0, 0, 0]); // role, flags
  return Buffer.concat([
    record(BEGIN_REQUEST, id, begin),
    record(PARAMS, id, encodeParams(params)),
    record(PARAMS, id),
    ...(bodyBuf.length ? [record(STDIN, id, bodyBuf)] : []),
    record(STDIN, id),
  ]);
}

// The whole records at the start of buf: {answers: [{id, stdout, stderr, appStatus}] of
// the requests whose END_REQUEST is in, used: the bytes they took}. stdout and stderr
// collect per request id in acc (a Map) until its END_REQUEST.
function readRecords(buf, acc) {
  const answers = [];
  let off = 0;
  while (off + 8 <= buf.length) {
    const type = buf[off + 1];
    const id = buf.readUInt16BE(off + 2);
    const len = buf.readUInt16BE(off + 4);
    const pad = buf[off + 6];
    if (off + 8 + len + pad > buf.length) break;
    const content = buf.subarray(off + 8, off + 8 + len);
    if (!acc.has(id)) acc.set(id, { id, stdout: [], stderr: [], appStatus: null });
    const a = acc.get(id);
    if (type === STDOUT) a.stdout.push(content);
    else if (type === STDERR) a.stderr.push(content);
    else if (type === END_REQUEST) {
      a.appStatus = content.readUInt32BE(0);
      acc.delete(id);
      answers.push(a);
    }
    off += 8 + len + pad;
  }
  return { answers, used: off };
}

function answerOf(a) {
  const res = parseCgi(Buffer.concat(a.stdout));
  res.text = res.body.toString('utf8');
  try {
    res.json = JSON.parse(res.text);
  } catch {
    res.json = undefined;
  }
  res.rid = res.headers.get('x-request-id');
  res.stderr = Buffer.concat(a.stderr).toString('utf8');
  res.appStatus = a.appStatus;
  return res;
}

// One request over the unix socket sockPath. headers: HTTP request headers (sent as
// HTTP_* params; content-type and content-length as CONTENT_*). Returns
// {status, headers (a Headers), text, json, rid, stderr, appStatus}.
export async function fcgiRequest(sockPath, opts = {}) {
  const { method = 'GET', uri = '/', timeoutMs = 60000 } = opts;
  const request = requestRecords(1, 0, opts); // flags 0: close after

  const chunks = await new Promise((resolve, reject) => {
    const sock = net.createConnection(sockPath);
    const got = [];
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new Error(`FastCGI request to ${sockPath} ${method} ${uri}: no answer within ${timeoutMs} ms`));
    }, timeoutMs);
    sock.on('connect', () => sock.write(request));
    sock.on('data', (d) => got.push(d));
    sock.on('error', (e) => {
      clearTimeout(timer);
      reject(new Error(`FastCGI request to ${sockPath}: ${e.message}`));
    });
    sock.on('close', () => {
      clearTimeout(timer);
      resolve(Buffer.concat(got));
    });
  });

  const { answers } = readRecords(chunks, new Map());
  if (!answers.length) throw new Error(`FastCGI request to ${sockPath} ${method} ${uri}: no END_REQUEST record`);
  return answerOf(answers[0]);
}

// Several requests, one after the other, on one connection that the worker is asked to
// keep (FCGI_KEEP_CONN), as a web server that reuses its FastCGI connections sends them;
// each waits for the answer before it. Returns the answers, in order; the connection is
// ours to close, and is closed at the end.
export async function fcgiRequestsKept(sockPath, list, { timeoutMs = 60000 } = {}) {
  const sock = net.createConnection(sockPath);
  const acc = new Map();
  let pending = Buffer.alloc(0);
  let waiting = null;
  let failed = null;
  const ready = [];
  const fail = (e) => {
    failed = e;
    if (waiting) waiting.reject(e);
  };
  sock.on('data', (d) => {
    pending = Buffer.concat([pending, d]);
    const { answers, used } = readRecords(pending, acc);
    pending = pending.subarray(used);
    ready.push(...answers);
    if (waiting && ready.length) waiting.resolve(ready.shift());
  });
  sock.on('error', (e) => fail(new Error(`FastCGI connection to ${sockPath}: ${e.message}`)));
  sock.on('close', () => fail(new Error(`FastCGI connection to ${sockPath} closed by the worker`)));
  await new Promise((resolve, reject) => {
    sock.once('connect', resolve);
    sock.once('error', reject);
  });
  const out = [];
  try {
    for (const [i, opts] of list.entries()) {
      sock.write(requestRecords(i + 1, 1, opts));
      const a = await new Promise((resolve, reject) => {
        if (ready.length) return resolve(ready.shift());
        if (failed) return reject(failed);
        const timer = setTimeout(() => reject(new Error(`FastCGI request ${i + 1} on a kept connection: no answer within ${timeoutMs} ms`)), timeoutMs);
        const settle = (f) => (v) => {
          clearTimeout(timer);
          waiting = null;
          f(v);
        };
        waiting = { resolve: settle(resolve), reject: settle(reject) };
      });
      assert(a.id === i + 1, `answer for request ${a.id}, expected ${i + 1}`);
      out.push(answerOf(a));
    }
  } finally {
    sock.removeAllListeners('close');
    sock.destroy();
  }
  return out;
}

function assert(ok, message) {
  if (!ok) throw new Error(message);
}

// The listening unix sockets of the processes pids, from /proc: {path -> pid}. A worker
// that lighttpd started (bin-path) listens on fd 0, on a socket of its own
// (<socket>-<n> with max-procs).
export function listeningSockets(pids) {
  const inodes = new Map(); // inode -> path
  for (const l of fs.readFileSync('/proc/net/unix', 'utf8').split('\n').slice(1)) {
    const f = l.trim().split(/\s+/);
    // Num RefCount Protocol Flags Type St Inode Path; St 01 is LISTEN (SS_UNCONNECTED)
    // and Flags 00010000 is __SO_ACCEPTCON.
    if (f.length >= 8 && (parseInt(f[3], 16) & 0x10000) !== 0) inodes.set(f[6], f[7]);
  }
  const out = new Map();
  for (const pid of pids) {
    let fds = [];
    try {
      fds = fs.readdirSync(`/proc/${pid}/fd`);
    } catch {
      continue;
    }
    for (const fd of fds) {
      let link;
      try {
        link = fs.readlinkSync(`/proc/${pid}/fd/${fd}`);
      } catch {
        continue;
      }
      const m = /^socket:\[(\d+)\]$/.exec(link);
      if (m && inodes.has(m[1])) out.set(inodes.get(m[1]), pid);
    }
  }
  return out;
}
