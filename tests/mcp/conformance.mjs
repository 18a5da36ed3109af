// The official MCP conformance tool (server mode) against the broker's MCP
// endpoint, once per protocol revision's requirement set, with the checked-in
// expected-failures baselines. Its runner sends no Authorization header, so
// this broker has no tokens (tenant "default"). Needs Node >= 22.
// Usage: node conformance.mjs BUILD_DIR
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { startBroker } from './broker.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const cli = path.join(here, 'node_modules/@modelcontextprotocol/conformance/dist/index.js');
const broker = await startBroker(path.resolve(process.argv[2]), {});
const cwd = fs.mkdtempSync(path.join(os.tmpdir(), 'mcp-conformance-'));
let failed = 0;
for (const revision of ['2025-11-25', '2026-07-28']) {
  const t0 = Date.now();
  const r = spawnSync(process.execPath, [cli, 'server', '--url', broker.url,
    '--requirements', revision,
    '--expected-failures', path.join(here, `expected-failures-${revision}.yaml`)],
  { cwd, encoding: 'utf8', timeout: 120000 });
  const out = `${r.stdout}${r.stderr}`;
  const summary = out.slice(out.indexOf('=== SUMMARY ==='));
  console.log(`--- requirements ${revision} (${Date.now() - t0} ms)\n${summary}`);
  if (r.status !== 0) {
    failed++;
    console.log(`FAIL requirements ${revision}: exit ${r.status}`);
  }
}
await broker.stop();
fs.rmSync(cwd, { recursive: true, force: true });
process.exit(failed ? 1 : 0);
