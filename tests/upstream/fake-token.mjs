#!/usr/bin/env node
// A fake OAuth token endpoint for tests of held logins (ADR 0036): the refresh requests of
// claude (POST /v1/oauth/token) and codex (POST /oauth/token), each answered with new
// tokens: "<old refresh token>-r<n>" style values, so that a test can tell which refresh
// made them. claude's answer: {access_token, refresh_token, expires_in, token_type};
// codex's: {access_token (a JWT whose exp is an hour ahead), id_token, refresh_token}.
//   node fake-token.mjs [PORT]         prints the port it listens on (127.0.0.1) first
// FAKE_TOKEN_DELAY_MS (env) holds each answer back, to make two workers' refreshes
// overlap; FAKE_TOKEN_FAIL=1 answers 400 (invalid_grant). Every request is logged at
// GET /_requests with its grant_type, refresh_token and client_id.
import { serve, sleep } from './common.mjs';

const DELAY = Number(process.env.FAKE_TOKEN_DELAY_MS ?? 0);
let n = 0;
const b64 = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
const jwt = (claims) => `${b64({ alg: 'none', typ: 'JWT' })}.${b64(claims)}.c2ln`;

serve('token', async (req, res, body, entry) => {
  const path = req.url.split('?')[0];
  Object.assign(entry, { grant_type: body.grant_type ?? null, refresh_token: body.refresh_token ?? null,
    client_id: body.client_id ?? null });
  if (req.method !== 'POST' || (path !== '/v1/oauth/token' && path !== '/oauth/token')) {
    res.writeHead(404, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: 'not_found' }));
    return;
  }
  if (DELAY) await sleep(DELAY);
  if (process.env.FAKE_TOKEN_FAIL === '1' || body.grant_type !== 'refresh_token' || !body.refresh_token) {
    res.writeHead(400, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: 'invalid_grant' }));
    return;
  }
  const k = ++n;
  const now = Math.floor(Date.now() / 1000);
  res.writeHead(200, { 'content-type': 'application/json' });
  if (path === '/v1/oauth/token') {
    res.end(JSON.stringify({ token_type: 'Bearer', access_token: `sk-ant-oat01-REFRESHED-${k}-${'a'.repeat(24)}`,
      refresh_token: `${body.refresh_token}-r${k}`, expires_in: 3600, scope: 'user:inference user:profile' }));
    return;
  }
  const auth = { chatgpt_account_id: 'acct-real-0123456789abcdef', chatgpt_plan_type: 'plus' };
  res.end(JSON.stringify({ access_token: jwt({ exp: now + 3600, tag: `REFRESHED-${k}`, 'https://api.openai.com/auth': auth }),
    id_token: jwt({ exp: now + 3600, email: 'owner@example.com', 'https://api.openai.com/auth': auth }),
    refresh_token: `${body.refresh_token}-r${k}` }));
});
