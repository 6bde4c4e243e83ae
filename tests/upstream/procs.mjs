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
