// The official MCP TypeScript clients judge the broker's MCP endpoint: the
// v1 SDK (@modelcontextprotocol/sdk, 2025-11-25) and the v2 client
// (@modelcontextprotocol/client, auto and pinned 2026-07-28), over
// Streamable HTTP with a bearer token and over stdio via `sandboxctl mcp`.
// Usage: node clients.mjs BUILD_DIR
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

import { Client as V1Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport as V1Http } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { StdioClientTransport as V1Stdio } from '@modelcontextprotocol/sdk/client/stdio.js';
import { Client as V2Client, StreamableHTTPClientTransport as V2Http } from '@modelcontextprotocol/client';
import { StdioClientTransport as V2Stdio } from '@modelcontextprotocol/client/stdio';

import { startBroker } from './broker.mjs';

const buildDir = path.resolve(process.argv[2]);
const sandboxctl = path.join(buildDir, 'sandboxctl');
const TOKEN_A = 'token-a-0123456789';
const TOKEN_B = 'token-b-0123456789';
const broker = await startBroker(buildDir, {
  auth: { tokens: { [TOKEN_A]: 'tenant-a', [TOKEN_B]: 'tenant-b' } },
  mcp: { keepalive_seconds: 1 },
});

let failures = 0;
async function step(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    console.log(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    failures++;
    console.log(`FAIL ${name}: ${e.stack || e}`);
  }
}

function stdioParams(token) {
  return {
    command: sandboxctl,
    args: ['mcp'],
    env: { ...process.env, SANDBOX_BROKER_ADDR: broker.grpcAddr, SANDBOX_BROKER_TOKEN: token },
    stderr: 'inherit',
  };
}

const info = { name: 'broker-mcp-test', version: '1.0.0' };
const kinds = [
  { name: 'v1 sdk / http', v: 1, modern: false,
    make: (token = TOKEN_A) => ({
      client: new V1Client(info),
      transport: new V1Http(new URL(broker.url), {
        requestInit: { headers: { Authorization: `Bearer ${token}` } } }) }) },
  { name: 'v2 client auto / http', v: 2, modern: true,
    make: (token = TOKEN_A) => ({
      client: new V2Client(info, { versionNegotiation: { mode: 'auto' } }),
      transport: new V2Http(new URL(broker.url), {
        requestInit: { headers: { Authorization: `Bearer ${token}` } } }) }) },
  { name: 'v2 client pinned 2026-07-28 / http', v: 2, modern: true,
    make: (token = TOKEN_A) => ({
      client: new V2Client(info, { versionNegotiation: { mode: { pin: '2026-07-28' } } }),
      transport: new V2Http(new URL(broker.url), {
        requestInit: { headers: { Authorization: `Bearer ${token}` } } }) }) },
  { name: 'v1 sdk / stdio', v: 1, modern: false, stdio: true,
    make: (token = TOKEN_A) => ({ client: new V1Client(info), transport: new V1Stdio(stdioParams(token)) }) },
  { name: 'v2 client auto / stdio', v: 2, modern: true, stdio: true,
    make: (token = TOKEN_A) => ({
      client: new V2Client(info, { versionNegotiation: { mode: 'auto' } }),
      transport: new V2Stdio(stdioParams(token)) }) },
  { name: 'v2 client pinned 2026-07-28 / stdio', v: 2, modern: true, stdio: true,
    make: (token = TOKEN_A) => ({
      client: new V2Client(info, { versionNegotiation: { mode: { pin: '2026-07-28' } } }),
      transport: new V2Stdio(stdioParams(token)) }) },
];

function call(kind, client, name, args, options = {}) {
  const params = { name, arguments: args };
  return kind.v === 1 ? client.callTool(params, undefined, options) : client.callTool(params, options);
}

function brokerSessions(token) {
  return execFileSync(sandboxctl, ['--addr', broker.grpcAddr, '--token', token, 'sessions'])
    .toString();
}

let n = 0;
for (const kind of kinds) {
  const p = `t${n++}`;  // file prefix: modern clients share the tenant's session "mcp"
  const { client, transport } = kind.make();
  await step(`${kind.name}: connect`, async () => {
    await client.connect(transport);
    if (kind.v === 2) {
      assert.equal(client.getNegotiatedProtocolVersion(), '2026-07-28');
    }
    assert.ok(client.getServerCapabilities().tools);
  });
  let defaultSession = '';
  await step(`${kind.name}: tools/list`, async () => {
    const { tools } = await client.listTools();
    const names = tools.map((t) => t.name).sort();
    assert.deepEqual(names, ['sandbox_local_read_file', 'sandbox_local_run', 'sandbox_local_shell',
      'sandbox_local_write_file']);
    for (const t of tools) {
      assert.equal(t.outputSchema.type, 'object');
      assert.equal(t.inputSchema.properties.session.type, 'string');
    }
  });
  await step(`${kind.name}: run python`, async () => {
    const r = await call(kind, client, 'sandbox_local_run', { code: 'print(6 * 7)' });
    assert.equal(r.isError, false);
    assert.equal(r.structuredContent.output, '42\n');
    assert.equal(r.structuredContent.exitCode, 0);
    assert.equal(r.structuredContent.timedOut, false);
    assert.equal(r.structuredContent.truncated, false);
    assert.deepEqual(JSON.parse(r.content[0].text), { output: '42\n', exitCode: 0 });
    defaultSession = r.structuredContent.session;
    if (kind.modern) assert.equal(defaultSession, 'mcp');
    else assert.match(defaultSession, /^mcp-[0-9a-f]{16}$/);
  });
  await step(`${kind.name}: run node`, async () => {
    const r = await call(kind, client, 'sandbox_local_run', { code: 'console.log(40 + 2)', language: 'node' });
    assert.equal(r.structuredContent.output, '42\n');
  });
  await step(`${kind.name}: shell (a failing exit is a result, not an error)`, async () => {
    const r = await call(kind, client, 'sandbox_local_shell', { command: 'echo $((6*7)); exit 3' });
    assert.equal(r.isError, false);
    assert.equal(r.structuredContent.output, '42\n');
    assert.equal(r.structuredContent.exitCode, 3);
  });
  await step(`${kind.name}: write, read, missing file, files persist in the session`, async () => {
    const w = await call(kind, client, 'sandbox_local_write_file', { path: `${p}/f.txt`, contents: 'hello' });
    assert.equal(w.isError, false);
    assert.equal(w.content[0].text, 'ok');
    assert.equal(w.structuredContent.session, defaultSession);
    const r = await call(kind, client, 'sandbox_local_read_file', { path: `${p}/f.txt` });
    assert.equal(r.content[0].text, 'hello');
    assert.deepEqual(r.structuredContent, { content: 'hello', found: true, session: defaultSession });
    const m = await call(kind, client, 'sandbox_local_read_file', { path: `${p}/missing.txt` });
    assert.equal(m.isError, false);
    assert.equal(m.content[0].text, '[file not found]');
    assert.equal(m.structuredContent.found, false);
    const run = await call(kind, client, 'sandbox_local_run', { code: `print(open('${p}/f.txt').read())` });
    assert.equal(run.structuredContent.output, 'hello\n');
  });
  await step(`${kind.name}: explicit session argument`, async () => {
    const s = `${p}-other`;
    const w = await call(kind, client, 'sandbox_local_write_file', { path: 'g.txt', contents: 'x', session: s });
    assert.equal(w.structuredContent.session, s);
    const there = await call(kind, client, 'sandbox_local_read_file', { path: 'g.txt', session: s });
    assert.equal(there.structuredContent.found, true);
    const here = await call(kind, client, 'sandbox_local_read_file', { path: 'g.txt' });
    assert.equal(here.structuredContent.found, false);
  });
  await step(`${kind.name}: isError for the model's mistakes`, async () => {
    const r = await call(kind, client, 'sandbox_local_run', { code: 'x', language: 'cobol' });
    assert.equal(r.isError, true);
    assert.match(r.content[0].text, /^error: argument "language"/);
    const s = await call(kind, client, 'sandbox_local_run', { code: 'x', session: 'bad session!' });
    assert.equal(s.isError, true);
    await assert.rejects(call(kind, client, 'no_such_tool', {}));
  });
  await step(`${kind.name}: progress notifications carry the output as it is produced`, async () => {
    const events = [];
    const r = await call(kind, client, 'sandbox_local_run', {
      code: 'import time\nfor i in range(3):\n    print("tick", i, flush=True)\n    time.sleep(0.3)',
    }, { onprogress: (e) => events.push(e) });
    assert.equal(r.structuredContent.output, 'tick 0\ntick 1\ntick 2\n');
    assert.ok(events.length >= 2, `only ${events.length} progress notifications`);
    for (let i = 1; i < events.length; i++) assert.ok(events[i].progress > events[i - 1].progress);
    assert.equal(events.map((e) => e.message).join(''), r.structuredContent.output);
  });
  await step(`${kind.name}: cancelling a call kills its run`, async () => {
    const ac = new AbortController();
    const marker = `${p}/after-cancel`;
    const pending = call(kind, client, 'sandbox_local_run', {
      code: `import time\nprint("started", flush=True)\ntime.sleep(2)\nopen("${marker}", "w").write("ran")`,
    }, { signal: ac.signal, onprogress: () => ac.abort('test cancels') });
    await assert.rejects(pending);
    await sleep(3000);
    const r = await call(kind, client, 'sandbox_local_read_file', { path: marker });
    assert.equal(r.structuredContent.found, false, 'the cancelled run kept running');
  });
  if (!kind.stdio) {
    await step(`${kind.name}: a long run completes (SSE keep-alives)`, async () => {
      const r = await call(kind, client, 'sandbox_local_run', {
        code: 'import time\ntime.sleep(2.5)\nprint("done")', timeoutSeconds: 10,
      }, { onprogress: () => {} });
      assert.equal(r.structuredContent.output, 'done\n');
    });
  }
  if (kind.name === 'v1 sdk / http') {
    await step(`${kind.name}: another tenant's token on this MCP session gets 404`, async () => {
      const sid = transport.sessionId;
      assert.ok(sid);
      for (const method of ['POST', 'DELETE']) {
        const res = await fetch(broker.url, {
          method,
          headers: { Authorization: `Bearer ${TOKEN_B}`, 'Mcp-Session-Id': sid,
            'Content-Type': 'application/json', Accept: 'application/json, text/event-stream',
            'MCP-Protocol-Version': '2025-11-25' },
          body: method === 'POST' ? JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }) : undefined,
        });
        assert.equal(res.status, 404, method);
      }
    });
    await step(`${kind.name}: DELETE ends the MCP session and closes its broker session`, async () => {
      assert.ok(brokerSessions(TOKEN_A).includes(defaultSession));
      await transport.terminateSession();
      assert.ok(!brokerSessions(TOKEN_A).includes(defaultSession));
    });
  }
  await client.close();
}

await step('http: no token and a bad token get 401 with WWW-Authenticate: Bearer', async () => {
  for (const auth of [undefined, 'Bearer wrong-token-123']) {
    const res = await fetch(broker.url, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream',
        ...(auth ? { Authorization: auth } : {}) },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize',
        params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: info } }),
    });
    assert.equal(res.status, 401);
    assert.match(res.headers.get('www-authenticate'), /^Bearer /);
  }
  const { client, transport } = kinds[0].make('Bearer-less-junk');
  await assert.rejects(client.connect(transport));
});

await step('http: a foreign Origin gets 403', async () => {
  const res = await fetch(broker.url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Origin: 'http://evil.example',
      Authorization: `Bearer ${TOKEN_A}` },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping' }),
  });
  assert.equal(res.status, 403);
});

await step('http: keep-alive comments on a quiet stream', async () => {
  const meta = { 'io.modelcontextprotocol/protocolVersion': '2026-07-28',
    'io.modelcontextprotocol/clientCapabilities': {} };
  const res = await fetch(broker.url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream',
      Authorization: `Bearer ${TOKEN_A}`, 'MCP-Protocol-Version': '2026-07-28',
      'Mcp-Method': 'tools/call', 'Mcp-Name': 'sandbox_local_run' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 9, method: 'tools/call', params: {
      name: 'sandbox_local_run', arguments: { code: 'import time\ntime.sleep(2.5)\nprint("late")' },
      _meta: meta } }),
  });
  assert.equal(res.headers.get('content-type'), 'text/event-stream');
  const text = await res.text();
  const comments = text.split('\n').filter((l) => l.startsWith(':')).length;
  assert.ok(comments >= 2, `${comments} keep-alive comments in ${JSON.stringify(text)}`);
  assert.match(text, /"output":"late\\n"/);
});

await step('tenants: the stateless session "mcp" is per tenant', async () => {
  const a = kinds[2].make(TOKEN_A);
  const b = kinds[2].make(TOKEN_B);
  await a.client.connect(a.transport);
  await b.client.connect(b.transport);
  await call(kinds[2], b.client, 'sandbox_local_write_file', { path: 'tenant.txt', contents: 'b' });
  const r = await call(kinds[2], a.client, 'sandbox_local_read_file', { path: 'tenant.txt' });
  assert.equal(r.structuredContent.found, false);
  const rb = await call(kinds[2], b.client, 'sandbox_local_read_file', { path: 'tenant.txt' });
  assert.equal(rb.structuredContent.content, 'b');
  await a.client.close();
  await b.client.close();
});

await broker.stop();
if (failures) {
  console.log(`${failures} failed`);
  process.exit(1);
}
console.log('all MCP client checks passed');
process.exit(0);
