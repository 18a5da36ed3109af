// Starts a real sandbox-brokerd with an MCP listener on a free port and
// reports its addresses (from its "mcp.serving" / "broker.serving" logs).
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export async function startBroker(buildDir, config) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'mcp-test-'));
  const cfg = path.join(dir, 'config.json');
  fs.writeFileSync(cfg, JSON.stringify({
    listen: '127.0.0.1:0',
    ...config,
    mcp: { listen: '127.0.0.1:0', ...(config.mcp || {}) },
  }));
  const proc = spawn(path.join(buildDir, 'sandbox-brokerd'), ['--config', cfg], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let log = '';
  const ready = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`broker did not start:\n${log}`)), 20000);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const mcp = log.match(/mcp\.serving address=(\S+) .*port=(\d+)/);
      const grpc = log.match(/broker\.serving address=(\S+)/);
      if (mcp && grpc) {
        clearTimeout(timer);
        resolve({ mcpPort: Number(mcp[2]), grpcAddr: grpc[1] });
      }
    });
    proc.on('exit', (code) => reject(new Error(`broker exited ${code}:\n${log}`)));
  });
  const addrs = await ready;
  return {
    ...addrs,
    url: `http://127.0.0.1:${addrs.mcpPort}/mcp`,
    log: () => log,
    async stop() {
      proc.kill('SIGTERM');
      await new Promise((r) => (proc.exitCode !== null ? r() : proc.on('exit', r)));
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}
