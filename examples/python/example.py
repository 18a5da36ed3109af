#!/usr/bin/python3
"""A sandbox-broker client in Python, using stubs generated from proto/.

Generate the stubs (Debian: python3-grpcio, protobuf-compiler-grpc):

    protoc -I proto --python_out=gen --grpc_out=gen \
        --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin \
        proto/sandboxbroker/v1/broker.proto

then run with Debian's interpreter (it has grpcio):

    PYTHONPATH=gen /usr/bin/python3 examples/python/example.py --addr 127.0.0.1:50051 [--token T]

It shows run, files, tools and streaming, checks each answer, and exits
non-zero if one is wrong (CI runs it against a live broker).
"""

import argparse
import base64
import json
import sys
import uuid

import grpc
from sandboxbroker.v1 import broker_pb2 as pb
from sandboxbroker.v1 import broker_pb2_grpc as pb_grpc

passed = 0
failed = 0


def check(name, got, want):
    global passed, failed
    if got == want:
        passed += 1
        print(f"ok   {name}")
    else:
        failed += 1
        print(f"FAIL {name}: got {got!r}, want {want!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", default="127.0.0.1:50051")
    ap.add_argument("--token", default="")
    args = ap.parse_args()

    channel = grpc.insecure_channel(args.addr)
    stub = pb_grpc.SandboxBrokerStub(channel)
    md = [("authorization", f"Bearer {args.token}")] if args.token else []
    session = f"py-{uuid.uuid4().hex[:8]}"

    # Run: python by default; a nonzero exit is a result, not an error.
    r = stub.Run(pb.RunRequest(session_id=session, code="print(6 * 7)"), metadata=md)
    check("run python", (r.output, r.exit_code), ("42\n", 0))
    r = stub.Shell(pb.ShellRequest(session_id=session, command="echo $WHO; exit 3",
                                   env={"WHO": "py"}), metadata=md)
    check("shell exit code", (r.output, r.exit_code), ("py\n", 3))
    r = stub.Run(pb.RunRequest(session_id=session, code="import time; time.sleep(5)",
                               timeout_seconds=1), metadata=md)
    check("timeout", (r.timed_out, r.exit_code), (True, 124))

    # Files: utf8 and base64; a missing file is found=false.
    stub.WriteFile(pb.WriteFileRequest(session_id=session, path="data/in.txt",
                                       contents="hello"), metadata=md)
    blob = bytes(range(256))
    stub.WriteFile(pb.WriteFileRequest(session_id=session, path="blob.bin",
                                       contents=base64.b64encode(blob).decode(),
                                       encoding=pb.ENCODING_BASE64), metadata=md)
    f = stub.ReadFile(pb.ReadFileRequest(session_id=session, path="data/in.txt"), metadata=md)
    check("read utf8", (f.found, f.contents), (True, "hello"))
    f = stub.ReadFile(pb.ReadFileRequest(session_id=session, path="blob.bin",
                                         encoding=pb.ENCODING_BASE64), metadata=md)
    check("read base64", base64.b64decode(f.contents), blob)
    f = stub.ReadFile(pb.ReadFileRequest(session_id=session, path="missing"), metadata=md)
    check("read missing", f.found, False)

    # Tools: hand the definitions to a model, pass its calls straight back.
    tools = stub.ListTools(pb.ListToolsRequest(dialect="openai"), metadata=md).tools
    names = [t.name for t in tools]
    check("tools listed", "sandbox_local_run" in names, True)
    check("openai shape", json.loads(tools[0].definition_json)["type"], "function")
    c = stub.CallTool(pb.CallToolRequest(session_id=session, name="sandbox_local_run",
                                         arguments_json=json.dumps({"code": "print(1 + 1)"})),
                      metadata=md)
    check("call tool", (json.loads(c.content), c.is_error), ({"output": "2\n", "exitCode": 0}, False))
    c = stub.CallTool(pb.CallToolRequest(session_id=session, name="sandbox_local_run",
                                         arguments_json="{bad json"), metadata=md)
    check("bad tool call", c.is_error, True)

    # Streaming: chunks as they come, then the result.
    chunks, result = [], None
    for ev in stub.RunStream(pb.RunRequest(
            session_id=session,
            code="import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.05)"),
            metadata=md):
        if ev.HasField("output"):
            chunks.append(ev.output.data)
        else:
            result = ev.result
    check("stream", (b"".join(chunks), result.exit_code), (b"0\n1\n2\n", 0))

    # Errors carry gRPC codes.
    try:
        stub.GetSession(pb.GetSessionRequest(session_id="no-such-session"), metadata=md)
        check("not found", "no error", grpc.StatusCode.NOT_FOUND)
    except grpc.RpcError as e:
        check("not found", e.code(), grpc.StatusCode.NOT_FOUND)

    closed = stub.CloseSession(pb.CloseSessionRequest(session_id=session), metadata=md)
    check("close", closed.existed, True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
