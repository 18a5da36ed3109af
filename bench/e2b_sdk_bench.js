#!/usr/bin/env node
// Baseline 3: the official e2b SDK doing the same sequence as broker_bench's
// adapter run (N x commands.run, files.write, files.read) against the same
// fake. Prints {"median_ms": ...}.
//   node e2b_sdk_bench.js URL API_KEY N
'use strict';
const path = require('path');
const { Sandbox } = require(path.join(__dirname, '..', 'tests', 'conformance', 'e2b', 'node_modules', 'e2b'));

async function main() {
  const [url, apiKey, n] = process.argv.slice(2);
  const opts = { apiKey, apiUrl: url, sandboxUrl: url };
  const sbx = await Sandbox.create({ ...opts, timeoutMs: 300000 });
  const times = [];
  for (let i = 0; i < Number(n); i++) {
    const t = process.hrtime.bigint();
    await sbx.commands.run('echo hi');
    await sbx.files.write('/tmp/f.txt', 'hello');
    await sbx.files.read('/tmp/f.txt');
    times.push(Number(process.hrtime.bigint() - t) / 1e6);
  }
  await sbx.kill();
  times.sort((a, b) => a - b);
  console.log(JSON.stringify({ median_ms: times[Math.floor(times.length / 2)] }));
}
main().catch((e) => { console.error(e); process.exit(1); });
