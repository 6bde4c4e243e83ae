// The test registry plus "metered": a command provider that reports token usage as an
// OpenAI-compatible tool does, for the usage ledger's tests (usage, dashboard, bench).

import { testRegistry } from './harness.mjs';

// A command provider that reports usage as an OpenAI-compatible tool does (ndjson chunks,
// the last with "usage"), after a short pause so that requests sent at once overlap and
// spread over the workers.
export const PROMPT_TOKENS = 7;
export const COMPLETION_TOKENS = 5;
const METERED =
  'cat >/dev/null; sleep 0.3; ' +
  `printf '%s\\n' '{"choices":[{"delta":{"content":"metered answer"}}]}' ` +
  `'{"choices":[{"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":${PROMPT_TOKENS},"completion_tokens":${COMPLETION_TOKENS},"total_tokens":${PROMPT_TOKENS + COMPLETION_TOKENS}}}'`;

export function meteredRegistry() {
  const reg = testRegistry();
  reg.providers.metered = {
    type: 'command',
    displayName: 'Metered',
    argv: ['/bin/sh', '-c', METERED],
    output: 'ndjson',
    timeout_s: 20,
    network: false,
    max_concurrent: 16,
    models: [{ id: 'metered', displayName: 'Metered', created: 1700000000 }],
  };
  return reg;
}

