// For the tests that drive the fake upstreams and egress-forward: start a process that
// prints the port it listens on as its first line of stdout.
import { spawn } from 'node:child_process';

// Resolves {child, port} once the port is printed; rejects if the process exits first
// (with its stderr). Every child started is added to `children`, for the test's clean-up.
export function startProc(argv, env, what, children) {
  return new Promise((resolve, reject) => {
    const child = spawn(argv[0], argv.slice(1), { stdio: ['pipe', 'pipe', 'pipe'], env });
    children.add(child);
    let out = '';
    child.stderrText = '';
    child.stderr.on('data', (d) => {
      child.stderrText += d;
    });
    child.stdout.on('data', (d) => {
      out += d;
      const nl = out.indexOf('\n');
      if (nl > 0) resolve({ child, port: Number(out.slice(0, nl)) });
    });
    child.on('exit', (code) => reject(new Error(`${what} exited with ${code}: ${child.stderrText}`)));
  });
}

// Start one of the fake upstreams of this directory (fake-anthropic.mjs, fake-openai.mjs)
// on a free port, with env added to ours; resolves {child, port, url}. Its stderr is ours.
export function startUpstream(file, env, children) {
  return new Promise((resolve, reject) => {
    const script = new URL(file, import.meta.url).pathname;
    const child = spawn(process.execPath, [script, '0'], {
      stdio: ['ignore', 'pipe', 'inherit'],
      env: { ...process.env, ...env },
    });
    children.add(child);
    let out = '';
    child.stdout.on('data', (d) => {
      out += d;
      const nl = out.indexOf('\n');
      if (nl > 0) {
        const port = Number(out.slice(0, nl));
        resolve({ child, port, url: `http://127.0.0.1:${port}` });
      }
    });
    child.on('exit', (code) => reject(new Error(`${file} exited with ${code}`)));
  });
}
