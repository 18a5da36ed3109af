// Shared by the conformance scripts: numbered checks, expected errors, and
// starting a fake provider server (its first stdout line names its address).
'use strict';

const { spawn } = require('child_process');
const readline = require('readline');

let passed = 0;
let failed = 0;

function check(name, ok, detail) {
  if (ok) {
    passed++;
    console.log(`ok   ${name}`);
  } else {
    failed++;
    console.log(`FAIL ${name}${detail === undefined ? '' : ': ' + JSON.stringify(detail)}`);
  }
}

async function expectError(name, fn, cls, extra) {
  try {
    const v = await fn();
    check(name, false, { resolved: v });
  } catch (e) {
    const ok = e instanceof cls && (!extra || extra(e));
    check(name, ok, ok ? undefined : { class: e.constructor.name, message: e.message, statusCode: e.statusCode });
  }
}

// Resolves {child, address} with address = "127.0.0.1:PORT".
function startFake(binary, apiKey) {
  return new Promise((resolve, reject) => {
    const child = spawn(binary, ['--port', '0', '--api-key', apiKey], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    child.on('error', reject);
    readline.createInterface({ input: child.stdout }).once('line', (line) => {
      const m = /^listening on (127\.0\.0\.1:\d+)$/.exec(line);
      if (!m) reject(new Error(`unexpected first line: ${line}`));
      else resolve({ child, address: m[1] });
    });
  });
}

// Prints the summary line; returns the exit code.
function finish() {
  console.log(`${passed} passed, ${failed} failed`);
  return failed ? 1 : 0;
}

module.exports = { check, expectError, startFake, finish };
