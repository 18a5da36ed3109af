#!/usr/bin/env node
// The official Daytona SDK (@daytonaio/sdk, pinned in package-lock.json)
// against our fake Daytona server: every scenario must behave as it does
// against Daytona itself.
//   node conformance.js /path/to/fake-daytona
// Prints one line per check and "N passed, N failed"; exits 1 on a failure.
'use strict';

const { check, expectError, startFake, finish } = require('../harness');
const sdk = require('@daytonaio/sdk');
const { Daytona } = sdk;

async function main() {
  const binary = process.argv[2];
  if (!binary) throw new Error('usage: conformance.js FAKE_DAYTONA_BINARY');
  const { child, address } = await startFake(binary, 'dtn_conformance_key');
  const apiUrl = `http://${address}/api`;
  const daytona = new Daytona({ apiKey: 'dtn_conformance_key', apiUrl, target: 'us' });
  const created = [];
  try {
    await expectError('a wrong key -> DaytonaAuthenticationError',
      () => new Daytona({ apiKey: 'dtn_wrong', apiUrl, target: 'us' }).create(), sdk.DaytonaAuthenticationError);

    const py = await daytona.create({ language: 'python', envVars: { FOO: 'bar' }, labels: { team: 'cpp' } });
    created.push(py);
    check('create (python) is started', py.state === 'started' && typeof py.id === 'string', py.state);
    const run = await py.process.codeRun('print(6 * 7)');
    check('codeRun python', run.exitCode === 0 && run.result === '42\n', run);
    const env = await py.process.codeRun('import os; print(os.environ["FOO"], os.environ.get("X"))', { env: { X: 'y' } });
    check('codeRun env (create and call)', env.result === 'bar y\n', env);

    const hi = await py.process.executeCommand('echo hi');
    check('executeCommand success', hi.exitCode === 0 && hi.result === 'hi\n', hi);
    const bad = await py.process.executeCommand('echo out; echo err >&2; exit 3');
    check('nonzero exit is a result, not an error', bad.exitCode === 3 && bad.result === 'out\nerr\n', bad);
    const cwd = await py.process.executeCommand('pwd; echo $FOO $A', '/tmp', { A: '1' });
    check('executeCommand cwd and env', cwd.result === '/tmp\nbar 1\n', cwd);
    const who = await py.process.executeCommand('whoami; pwd');
    check('default user and cwd look like Daytona', who.result === 'daytona\n/home/daytona\n', who);
    await expectError('timeout -> DaytonaTimeoutError',
      () => py.process.executeCommand('sleep 100', undefined, undefined, 1), sdk.DaytonaTimeoutError);

    await py.fs.uploadFile(Buffer.from('hello world\n'), '/home/daytona/hello.txt');
    const text = await py.fs.downloadFile('/home/daytona/hello.txt');
    check('upload and download text', Buffer.isBuffer(text) && text.toString() === 'hello world\n', String(text));
    const bytes = Buffer.from([0, 1, 2, 253, 254, 255, 13, 10]);
    await py.fs.uploadFile(bytes, '/tmp/b.bin');
    const back = await py.fs.downloadFile('/tmp/b.bin');
    check('binary round trip', Buffer.from(back).equals(bytes), Array.from(back));
    await py.fs.uploadFile(Buffer.alloc(0), '/home/daytona/empty.txt');
    check('empty file', (await py.fs.downloadFile('/home/daytona/empty.txt')).length === 0);
    const seen = await py.process.executeCommand('wc -c < /tmp/b.bin; cat hello.txt');
    check('uploaded files are visible to commands', seen.result === '8\nhello world\n', seen);
    await expectError('download of a missing file -> not found',
      () => py.fs.downloadFile('/home/daytona/missing.txt'), sdk.DaytonaNotFoundError,
      (e) => e.statusCode === 404);

    const js = await daytona.create({ language: 'javascript' });
    created.push(js);
    const jr = await js.process.codeRun('console.log(6 * 7)');
    check('codeRun javascript', jr.exitCode === 0 && jr.result === '42\n', jr);
    const ts = await daytona.create({ language: 'typescript' });
    created.push(ts);
    const tr = await ts.process.codeRun('const x: number = 1; console.log(x + 1)'.replace(': number', ''));
    check('codeRun typescript (plain JS subset)', tr.exitCode === 0 && tr.result === '2\n', tr);

    // Egress fields (docs/network.md): what the SDK sends is what the fake
    // records and echoes; the broker's adapter is checked against the same
    // fake (tests/integration/daytona_test.cc).
    const net = await daytona.create({ language: 'python', networkAllowList: '10.0.0.0/8,1.2.3.4/32',
      domainAllowList: 'pypi.org' });
    created.push(net);
    const netGot = await daytona.get(net.id);
    check('create with allow lists: get echoes them', netGot.networkAllowList === '10.0.0.0/8,1.2.3.4/32' &&
      netGot.domainAllowList === 'pypi.org' && netGot.networkBlockAll === false, netGot);
    await expectError('a domain in networkAllowList -> 400',
      () => daytona.create({ language: 'python', networkAllowList: 'pypi.org' }), sdk.DaytonaError,
      (e) => e.statusCode === 400);

    const got = await daytona.get(py.id);
    check('get', got.id === py.id && got.labels['code-toolbox-language'] === 'python' && got.labels.team === 'cpp', got.labels);
    const items = [];
    for await (const s of daytona.list({ labels: { team: 'cpp' } })) items.push(s);
    check('list filters by labels', items.length === 1 && items[0].id === py.id, items.map((s) => s.id));
    await expectError('get of an unknown sandbox -> DaytonaNotFoundError',
      () => daytona.get('does-not-exist'), sdk.DaytonaNotFoundError);

    for (const s of created.splice(0)) await daytona.delete(s);
    await expectError('a deleted sandbox is gone', () => daytona.get(py.id), sdk.DaytonaNotFoundError);
  } finally {
    for (const s of created) await daytona.delete(s).catch(() => {});
    child.kill('SIGTERM');
  }
  return finish();
}

main().then((code) => process.exit(code), (e) => { console.error(e); process.exit(1); });
