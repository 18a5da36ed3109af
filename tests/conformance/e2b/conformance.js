#!/usr/bin/env node
// The official e2b SDK (pinned in package-lock.json) against our fake E2B
// server: every scenario must behave as it does against E2B itself.
//   node conformance.js /path/to/fake-e2b
// Prints one line per check and "N passed, N failed"; exits 1 on a failure.
'use strict';

const { check, expectError, startFake, finish } = require('../harness');
const e2b = require('e2b');
const { Sandbox } = e2b;

async function main() {
  const binary = process.argv[2];
  if (!binary) throw new Error('usage: conformance.js FAKE_E2B_BINARY');
  const { child, address } = await startFake(binary, 'e2b_conformance_key');
  const url = `http://${address}`;
  const opts = { apiKey: 'e2b_conformance_key', apiUrl: url, sandboxUrl: url };
  try {
    await expectError('create with a wrong key -> AuthenticationError',
      () => Sandbox.create({ ...opts, apiKey: 'e2b_wrong' }), e2b.AuthenticationError);

    const sbx = await Sandbox.create({ ...opts, timeoutMs: 120000, metadata: { owner: 'cpp team' },
      envs: { FOO: 'bar' } });
    check('create returns a sandbox id', typeof sbx.sandboxId === 'string' && sbx.sandboxId.length > 0);

    const hi = await sbx.commands.run('echo hi');
    check('commands.run success', hi.exitCode === 0 && hi.stdout === 'hi\n' && hi.stderr === '', hi);

    await expectError('nonzero exit -> CommandExitError with the exit code',
      () => sbx.commands.run('echo partial; echo boom >&2; exit 3'), e2b.CommandExitError,
      (e) => e.exitCode === 3 && e.stdout === 'partial\n' && e.stderr === 'boom\n');

    const t0 = Date.now();
    await expectError('timeout -> TimeoutError', () => sbx.commands.run('sleep 100', { timeoutMs: 1500 }),
      e2b.TimeoutError);
    check('timeout fires on time', Date.now() - t0 < 10000, Date.now() - t0);

    const env = await sbx.commands.run('echo "$FOO $A"; pwd', { envs: { A: '1' }, cwd: '/tmp' });
    check('envs (create and run) and cwd', env.stdout === 'bar 1\n/tmp\n', env.stdout);
    const who = await sbx.commands.run('whoami; pwd; echo $HOME');
    check('default user and cwd look like E2B base', who.stdout === 'user\n/home/user\n/home/user\n', who.stdout);
    await expectError('missing cwd -> InvalidArgumentError',
      () => sbx.commands.run('pwd', { cwd: '/nope' }), e2b.InvalidArgumentError);

    const w = await sbx.files.write('/home/user/hello.txt', 'hello world\n');
    check('files.write returns the entry', w.path === '/home/user/hello.txt' && w.name === 'hello.txt', w);
    check('files.read text', (await sbx.files.read('/home/user/hello.txt')) === 'hello world\n');
    check('relative paths resolve in /home/user', (await sbx.files.read('hello.txt')) === 'hello world\n');
    const bytes = new Uint8Array([0, 1, 2, 253, 254, 255, 10, 13]);
    await sbx.files.write('/tmp/b.bin', bytes.buffer);
    const back = await sbx.files.read('/tmp/b.bin', { format: 'bytes' });
    check('files binary round trip', Buffer.from(back).equals(Buffer.from(bytes)), Array.from(back));
    await sbx.files.write('empty.txt', '');
    check('empty file', (await sbx.files.read('empty.txt')) === '');
    const seen = await sbx.commands.run('cat /tmp/b.bin | wc -c; cat hello.txt');
    check('files written are visible to commands', seen.stdout === '8\nhello world\n', seen.stdout);
    await expectError('read of a missing file -> FileNotFoundError',
      () => sbx.files.read('/home/user/missing.txt'), e2b.FileNotFoundError);
    check('files.exists on a missing path is false', (await sbx.files.exists('/nope')) === false);

    const bg = await sbx.commands.run('sleep 100', { background: true });
    check('background command has a pid', bg.pid > 0);
    check('kill of a running process', (await bg.kill()) === true);

    await sbx.setTimeout(60000);
    check('setTimeout', true);
    const info = await sbx.getInfo();
    check('getInfo', info.sandboxId === sbx.sandboxId && info.metadata.owner === 'cpp team', info);

    const page = await Sandbox.list({ ...opts, query: { metadata: { owner: 'cpp team' } } }).nextItems();
    check('list filters by metadata', page.length === 1 && page[0].sandboxId === sbx.sandboxId, page);

    // Egress rules (docs/network.md): what the SDK sends is what the fake
    // records and echoes; the broker's E2B adapter is checked against the
    // same fake (tests/integration/e2b_test.cc).
    const net = await Sandbox.create({ ...opts,
      network: { allowOut: ['pypi.org', '*.pythonhosted.org', '10.0.0.0/8'], denyOut: [e2b.ALL_TRAFFIC] } });
    const ni = await net.getInfo();
    check('create with network: getInfo echoes allowOut and denyOut',
      JSON.stringify(ni.network && ni.network.allowOut) === '["pypi.org","*.pythonhosted.org","10.0.0.0/8"]' &&
      JSON.stringify(ni.network.denyOut) === '["0.0.0.0/0"]', ni.network);
    await net.updateNetwork({ allowOut: ['example.com'], denyOut: [e2b.ALL_TRAFFIC] });
    const nu = await net.getInfo();
    check('updateNetwork replaces the rules',
      JSON.stringify(nu.network && nu.network.allowOut) === '["example.com"]', nu.network);
    await net.updateNetwork({ allowInternetAccess: true });
    const open = await net.getInfo();
    check('updateNetwork clears what it omits', open.network === undefined && open.allowInternetAccess === true,
      open);
    await expectError('a domain in denyOut -> 400', () => Sandbox.create({ ...opts,
      network: { denyOut: ['example.com'] } }), e2b.SandboxError, (e) => e.statusCode === 400);
    await net.kill();

    check('kill -> true', (await sbx.kill()) === true);
    check('kill again -> false', (await Sandbox.kill(sbx.sandboxId, opts)) === false);
    await expectError('a killed sandbox is gone for commands',
      () => sbx.commands.run('echo hi'), e2b.SandboxError);
  } finally {
    child.kill('SIGTERM');
  }
  return finish();
}

main().then((code) => process.exit(code), (e) => { console.error(e); process.exit(1); });
