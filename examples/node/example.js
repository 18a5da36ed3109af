#!/usr/bin/env node
// A sandbox-broker client in Node.js: @grpc/grpc-js with stubs generated at
// load time from proto/ by @grpc/proto-loader.
//
//   cd examples/node && npm ci
//   node example.js --addr 127.0.0.1:50051 [--token T]
//
// It shows run, files, tools and streaming, checks each answer, and exits
// non-zero if one is wrong (CI runs it against a live broker).
'use strict';

const path = require('path');
const crypto = require('crypto');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

function arg(name, def) {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : def;
}

const PROTO = path.join(__dirname, '..', '..', 'proto', 'sandboxbroker', 'v1', 'broker.proto');
const def = protoLoader.loadSync(PROTO, {
  keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
  includeDirs: [path.join(__dirname, '..', '..', 'proto')],
});
const { SandboxBroker } = grpc.loadPackageDefinition(def).sandboxbroker.v1;

let passed = 0;
let failed = 0;
function check(name, got, want) {
  const g = JSON.stringify(got);
  const w = JSON.stringify(want);
  if (g === w) {
    passed++;
    console.log(`ok   ${name}`);
  } else {
    failed++;
    console.log(`FAIL ${name}: got ${g}, want ${w}`);
  }
}

async function main() {
  const client = new SandboxBroker(arg('--addr', '127.0.0.1:50051'), grpc.credentials.createInsecure());
  const md = new grpc.Metadata();
  const token = arg('--token', '');
  if (token) md.add('authorization', `Bearer ${token}`);
  const call = (method, req) => new Promise((resolve, reject) =>
    client[method](req, md, (err, res) => (err ? reject(err) : resolve(res))));
  const session = `node-${crypto.randomBytes(4).toString('hex')}`;

  let r = await call('Run', { session_id: session, code: 'console.log(6 * 7)', language: 'LANGUAGE_NODE' });
  check('run node', [r.output, r.exit_code], ['42\n', 0]);
  r = await call('Shell', { session_id: session, command: 'echo $WHO; exit 3', env: { WHO: 'node' } });
  check('shell exit code', [r.output, r.exit_code], ['node\n', 3]);
  r = await call('Run', { session_id: session, code: 'import time; time.sleep(5)', timeout_seconds: 1 });
  check('timeout', [r.timed_out, r.exit_code], [true, 124]);

  await call('WriteFile', { session_id: session, path: 'data/in.txt', contents: 'hello' });
  const blob = Buffer.from([...Array(256).keys()]);
  await call('WriteFile', { session_id: session, path: 'blob.bin', contents: blob.toString('base64'), encoding: 'ENCODING_BASE64' });
  let f = await call('ReadFile', { session_id: session, path: 'data/in.txt' });
  check('read utf8', [f.found, f.contents], [true, 'hello']);
  f = await call('ReadFile', { session_id: session, path: 'blob.bin', encoding: 'ENCODING_BASE64' });
  check('read base64', Buffer.from(f.contents, 'base64').equals(blob), true);
  f = await call('ReadFile', { session_id: session, path: 'missing' });
  check('read missing', f.found, false);

  const tools = (await call('ListTools', { dialect: 'anthropic' })).tools;
  check('tools listed', tools.map((t) => t.name).includes('sandbox_local_shell'), true);
  check('anthropic shape', JSON.parse(tools[0].definition_json).input_schema.type, 'object');
  let c = await call('CallTool', { session_id: session, name: 'sandbox_local_shell', arguments_json: JSON.stringify({ command: 'echo tool' }) });
  check('call tool', [JSON.parse(c.content), c.is_error], [{ output: 'tool\n', exitCode: 0 }, false]);
  c = await call('CallTool', { session_id: session, name: 'sandbox_local_shell', arguments_json: '{}' });
  check('bad tool call', c.is_error, true);

  const chunks = [];
  let result = null;
  await new Promise((resolve, reject) => {
    const stream = client.RunStream({ session_id: session, language: 'LANGUAGE_NODE',
      code: 'let i = 0; const t = setInterval(() => { console.log(i++); if (i === 3) clearInterval(t); }, 50);' }, md);
    stream.on('data', (ev) => { if (ev.output) chunks.push(Buffer.from(ev.output.data)); else result = ev.result; });
    stream.on('error', reject);
    stream.on('end', resolve);
  });
  check('stream', [Buffer.concat(chunks).toString(), result.exit_code], ['0\n1\n2\n', 0]);

  try {
    await call('GetSession', { session_id: 'no-such-session' });
    check('not found', 'no error', grpc.status.NOT_FOUND);
  } catch (e) {
    check('not found', e.code, grpc.status.NOT_FOUND);
  }
  const closed = await call('CloseSession', { session_id: session });
  check('close', closed.existed, true);
  console.log(`${passed} passed, ${failed} failed`);
  client.close();
  return failed ? 1 : 0;
}

main().then((code) => process.exit(code), (e) => { console.error(e); process.exit(1); });
