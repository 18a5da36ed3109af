#!/usr/bin/env python3
"""Writes the seed corpora in fuzz/corpus/<target>/ from the payloads captured
from the real providers (tests/adapters/e2b/e2b_wire_test.cc,
tests/adapters/daytona/daytona_wire_test.cc, the fakes in tests/fakes/) and
the README's config and tool-call examples. Run once; the output is checked
in. Seeds follow each target's input layout (see the comment atop each
*_fuzz.cc): 0xFF separates fields."""
import hashlib, json, os, struct, sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
SEP = b"\xff"

def put(target, data):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    name = hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

def env(flags, payload):
    payload = payload.encode() if isinstance(payload, str) else payload
    return bytes([flags]) + struct.pack(">I", len(payload)) + payload

# ---- E2B: envd's process stream for run('echo hi') (reference 8.2) ----
E2B_EVENTS = [
    '{"event":{"start":{"pid":4242}}}',
    '{"event":{"data":{"stdout":"aGkK"}}}',
    '{"event":{"data":{"stderr":"Ym9vbQo="}}}',
    '{"event":{"end":{"exited":true,"status":"exit status 0"}}}',
    '{"event":{"end":{"exitCode":3,"exited":true,"error":"exit status 3"}}}',
    '{"event":{"end":{"exitCode":-1,"exited":false,"status":"signal: killed"}}}',
    '{"event":{"keepalive":{}}}',
    '{"event":{"somethingNew":{}}}',
    '{"event":{"data":{"stdout":"!!"}}}',
    '{"event":{"start":{"pid":"77"}}}',
]
E2B_END = [
    "{}",
    '{"error":{"code":"invalid_argument","message":"cwd \'/nope\' does not exist"}}',
    '{"error":{"code":"deadline_exceeded"}}',
    '{"error":{"code":5,"message":[]}}',
]
stream = b"".join(env(0, e) for e in E2B_EVENTS[:4]) + env(2, "{}")
for chunk in (1, 7, 63):
    put("e2b_envelope", bytes([chunk - 1, 200]) + stream)
put("e2b_envelope", bytes([0, 0]) + env(0, E2B_EVENTS[4]) + env(2, E2B_END[1]))
put("e2b_envelope", bytes([3, 200]) + b"\x00\x7f\xff\xff\xff")
put("e2b_envelope", bytes([3, 0]) + env(0, "x" * 100))
E2B_SANDBOX = ('{"sandboxID":"isbfake0001","clientID":"6532622b","templateID":"rki5dems9wqfm4r03t7g",'
               '"alias":"base","envdVersion":"0.6.4","envdAccessToken":"envd-token-abc","domain":null,'
               '"trafficAccessToken":null}')
for s in E2B_EVENTS + E2B_END + [E2B_SANDBOX, "<html>", '{"code":401,"message":"Invalid API key"}',
                                 '{"sandboxId":"x","message":"The sandbox was not found","code":502}',
                                 "oops", "[" * 64 + "]" * 64]:
    put("e2b_json", s)

# ---- Daytona: DTOs, toolbox replies, errors, bulk-download multipart ----
for s in [
    '{"id":"sbx-1","state":"started","labels":{"code-toolbox-language":"python"},'
    '"toolboxProxyUrl":"http://127.0.0.1:1/toolbox"}',
    '{"state":"started"}',
    '{"exitCode":3,"result":"out\\n"}', '{"code":-1,"result":""}', "oops",
    '{"path":"/api/sandbox/xyz","statusCode":404,"error":"Not Found",'
    '"message":"Sandbox with ID or name xyz not found"}',
    '{"errors":[],"files":[]}', '{"error":"request body must be {\\"paths\\": [ ... ]} and non-empty"}',
    '{"exitCode":1e400}', '{"a":' * 50 + "1" + "}" * 50,
]:
    put("daytona_json", s)
BULK = (b"--DAYTONA-FILE-BOUNDARY\r\n"
        b"Content-Disposition: form-data; name=\"error\"; filename=\"/home/daytona/missing.txt\"\r\n"
        b"Content-Type: application/json; charset=utf-8\r\n\r\n"
        b'{"statusCode":404,"message":"file not found: /home/daytona/missing.txt","code":"FILE_NOT_FOUND"}'
        b"\r\n--DAYTONA-FILE-BOUNDARY\r\n"
        b"Content-Disposition: form-data; name=\"file\"; filename=\"/home/daytona/hello.txt\"; "
        b"filename*=utf-8''%2Fhome%2Fdaytona%2Fhello.txt\r\n"
        b"Content-Type: text/plain\r\n\r\nhello world\n\r\n"
        b"--DAYTONA-FILE-BOUNDARY--\r\n")
CT = b"multipart/form-data; boundary=DAYTONA-FILE-BOUNDARY"
put("multipart", b"\x00" + CT + SEP + BULK + SEP + b"/home/daytona/hello.txt" + SEP +
    b"/home/daytona/missing.txt")
put("multipart", b"\x00" + CT + SEP + BULK + SEP + b"/other")
put("multipart", b"\x00application/json" + SEP + b"{}" + SEP + b"/x")
with_len = (b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n"
            b"Content-Length: 9\r\n\r\nx\r\n--B\r\nyy\r\n--B--\r\n")
put("multipart", b"\x00multipart/form-data; boundary=\"B\"" + SEP + with_len + SEP + b"a")
put("multipart", b"\x01file" + SEP + b"/home/daytona/a.txt" + SEP + b"bytes\x00\xff\r\n--x")
put("multipart", b"\x01file" + SEP + b"a" + SEP + b"1" + SEP + b"error" + SEP + b"b" + SEP + b"")

# ---- config, tokens file, authorization ----
CONFIGS = [
    "{}",
    json.dumps({"listen": "0.0.0.0:50051", "default_provider": "local", "idle_timeout_seconds": 300,
                "max_sessions_per_tenant": 10, "log_format": "json",
                "auth": {"tokens": {"s3cret-token-a": "team-a"}},
                "providers": {"local": {"memory_bytes": 1073741824},
                              "e2b": {"api_key": "e2b_x", "template": "base"}}}),
    json.dumps({"tls": {"cert_file": "/c.pem", "key_file": "/k.pem", "client_ca_file": "/ca.pem"}}),
    json.dumps({"idle_timeout_seconds": -1}), json.dumps({"max_threads": 18446744073709551615}),
    json.dumps({"default_timeout_seconds": 100, "max_timeout_seconds": 10}),
    json.dumps({"providers": {"x": 1}}), json.dumps({"auth": {"tokens": {"short": "t"}}}),
    json.dumps({"unknown_key": True}), json.dumps({"reflection": "yes"}),
    json.dumps({"auth": {"tokens_file": "/nonexistent/tokens.json"}}),
]
for c in CONFIGS:
    put("config", b"\x00" + c.encode())
for t in [json.dumps({"s3cret-token-a": "team-a", "s3cret-token-b": "team-b"}),
          json.dumps({"s3cret-token-a": "bad tenant!"}), json.dumps({"s3cret-token-a": 5}),
          "[]", "not json", json.dumps({"short": "t"})]:
    put("config", b"\x01" + t.encode())
for a in ["Bearer token-alpha-123", "bearer   BETA-token-xyz  ", "Bearer tok en with spaces",
          "Basic dXNlcjpwYXNz", "Bearer", "Bearer unknown-token-1", ""]:
    put("config", b"\x02" + a.encode())

# ---- CallTool: names and arguments, as models send them ----
TOOLS = [
    (0, "sandbox_local_run", '{"code":"print(6*7)","language":"python","timeoutSeconds":30}'),
    (0, "sandbox_e2b_run", '{"code":"console.log(1)","language":"node"}'),
    (1, "sandbox_local_shell", '{"command":"ls -la","timeoutSeconds":5.0}'),
    (2, "sandbox_daytona_write_file", '{"path":"/workspace/a.txt","contents":"aGk=","encoding":"base64"}'),
    (3, "sandbox_local_read_file", '{"path":"a.txt","encoding":"utf8"}'),
    (0, "sandbox_local_run", '{"code":"","language":"cobol"}'),
    (1, "sandbox_local_shell", '{"command":"x","timeoutSeconds":1e300}'),
    (1, "sandbox_local_shell", '{"command":"x","timeoutSeconds":-5}'),
    (2, "sandbox_local_write_file", '{"path":"a","contents":"x","extra":[[[[[]]]]]}'),
    (3, "not_a_tool", ""),
    (0, "sandbox__run", '"just a string"'),
    (0, "sandbox_local_run", '{"code":' + "[" * 200 + "]" * 200 + "}"),
]
for op, name, args in TOOLS:
    put("tools", bytes([op]) + name.encode() + SEP + args.encode())

# ---- paths for file operations ----
for op, path in [(1, "a/b.txt"), (2, "a/b.txt"), (1, "./a//b/../c"), (1, "/workspace/x"),
                 (2, "../outside/secret"), (2, "out/secret"), (1, "out/new"), (1, "abs/new"),
                 (2, "sub/secret"), (1, "sub/up/outside/x"), (2, "hard"), (1, "hard"),
                 (1, "loop/x"), (2, "/etc/passwd"), (1, "/workspacex/a"), (0, "."),
                 (0, "a\x00b"), (2, "sub/inside.txt"), (1, "sub/inside.txt"), (0, "x" * 300)]:
    put("workspace_fs", bytes([op]) + path.encode() + SEP + b"data\x00\xff")

# ---- base64 ----
for s in [b"", b"aGk=", b"aGkK", b"Ym9vbQo=", b"AA==", b"QR==", b"A===", b"====", b"aGk",
          b"aG k=", b"aGk=aGk=", b"-_-_", b"\x00\xff\x01binary"]:
    put("base64", s)

# ---- MCP endpoint (fuzz/mcp_http_fuzz.cc): requests from
# tests/server/mcp_server_test.cc, both eras. Layout: presence bits (2 bytes,
# little-endian, bit i = header i), method, 9 header fields, body.
MCP_HEADERS = ["origin", "host", "authorization", "mcp-session-id", "mcp-protocol-version",
               "content-type", "accept", "mcp-method", "mcp-name"]
def mcp(method, headers, body):
    bits = 0
    fields = []
    for i, h in enumerate(MCP_HEADERS):
        if h in headers:
            bits |= 1 << i
        fields.append(headers.get(h, "").encode())
    body = body if isinstance(body, (bytes, str)) else json.dumps(body)
    body = body.encode() if isinstance(body, str) else body
    put("mcp_http", struct.pack("<H", bits) + SEP.join([method.encode()] + fields + [body]))
BASE = {"host": "127.0.0.1:8080", "authorization": "Bearer tok-a-123456",
        "content-type": "application/json", "accept": "application/json, text/event-stream"}
LEG = dict(BASE, **{"mcp-session-id": "$SID", "mcp-protocol-version": "2025-11-25"})
META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}}
def modern(method, params, **extra):
    params = dict(params, _meta=dict(META, **params.get("_meta", {})))
    h = dict(BASE, **{"mcp-protocol-version": "2026-07-28", "mcp-method": method})
    if "name" in params: h["mcp-name"] = params["name"]
    h.update(extra)
    return h, {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
RUN = {"name": "sandbox_local_run", "arguments": {"code": "print(1)", "language": "python"}}
mcp("POST", BASE, {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                   "params": {"protocolVersion": "2025-11-25", "capabilities": {}}})
mcp("POST", dict(BASE, origin="https://evil.example"), {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                   "params": {"protocolVersion": "2025-06-18", "capabilities": {}}})
mcp("POST", LEG, {"jsonrpc": "2.0", "method": "notifications/initialized"})
mcp("POST", LEG, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
mcp("POST", LEG, {"jsonrpc": "2.0", "id": "p", "method": "ping"})
mcp("POST", LEG, {"jsonrpc": "2.0", "id": 3, "method": "logging/setLevel", "params": {"level": "info"}})
mcp("POST", LEG, {"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                  "params": dict(RUN, _meta={"progressToken": "t1"})})
mcp("POST", dict(LEG, accept="application/json"), {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                  "params": {"name": "sandbox_local_write_file",
                             "arguments": {"path": "a.txt", "contents": "hi", "session": "s1"}}})
mcp("POST", LEG, {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 4}})
mcp("POST", LEG, {"jsonrpc": "2.0", "id": 9, "result": {}})
mcp("DELETE", LEG, "")
mcp("DELETE", BASE, "")
mcp("GET", LEG, "")
mcp("PUT", BASE, "")
for m, p in [("tools/list", {}), ("tools/call", RUN), ("server/discover", {}),
             ("tools/call", {"name": "sandbox_local_read_file", "arguments": {"path": "a.txt"}}),
             ("ping", {}), ("tools/call", dict(RUN, _meta={"progressToken": 3}))]:
    h, b = modern(m, p)
    mcp("POST", h, b)
h, b = modern("tools/call", RUN, **{"mcp-name": "=?base64?c2FuZGJveF9sb2NhbF9ydW4=?="})
mcp("POST", h, b)
h, b = modern("tools/list", {}, **{"mcp-protocol-version": "2025-11-25"})
mcp("POST", h, b)
h, b = modern("tools/list", {"_meta": {"io.modelcontextprotocol/protocolVersion": "2099-01-01"}},
              **{"mcp-protocol-version": "2099-01-01"})
mcp("POST", h, b)
h, b = modern("notifications/initialized", {})
del b["id"]
mcp("POST", h, b)
mcp("POST", dict(BASE, authorization="Bearer wrong"), {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
mcp("POST", {k: v for k, v in BASE.items() if k != "authorization"}, "{}")
mcp("POST", BASE, "{not json")
mcp("POST", BASE, "[" * 70 + "]" * 70)
mcp("POST", BASE, '[{"jsonrpc":"2.0","id":1,"method":"ping"}]')
mcp("POST", dict(BASE, **{"content-type": "text/plain"}), "{}")
mcp("POST", dict(BASE, host="evil.example"), "{}")
mcp("POST", dict(BASE, origin="http://localhost:3000"), {"jsonrpc": "2.0", "id": {"x": 1}, "method": "ping"})

print("corpus written to", ROOT)
