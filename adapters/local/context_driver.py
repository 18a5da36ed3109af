# The context supervisor: one per local sandbox, inside its container, as the
# sandbox's user (docs/api.md#code-contexts). It keeps the session's code
# contexts, each a real IPython kernel (Debian's python3-ipykernel, driven by
# jupyter_client over ipc sockets in its own directory), and answers the
# broker on a unix socket there: a JSON request per line, each answered by
# JSON lines, the last one {"event": "done", ...}, then an empty line.
#
#   python3 -c SOURCE serve DIR MAX_CONTEXTS
#
# The process the broker starts forks the supervisor, waits until it listens
# and exits, so the broker's run ends ("ready" on stdout). The supervisor
# outlives it, in the session's container, until the sandbox goes.
#
# The broker embeds this file (adapters/local/CMakeLists.txt); it is never
# installed on its own. Nothing here may print to stdout after "ready".

import fcntl
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
import uuid

DONE = "done"


def now_ms():
    return int(time.time() * 1000)


class Failure(Exception):
    """An answer with a gRPC code name (the broker maps it)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


class Context:
    """One kernel, driven from one thread of its own (call): one execution
    at a time, in order, and jupyter_client's event loop made once for that
    thread rather than once per request."""

    def __init__(self, directory, cid, language, cwd, env):
        self.id = cid
        self.language = language
        self.cwd = cwd
        self.env = env
        self.created_at_ms = now_ms()
        self.dir = os.path.join(directory, "k-" + cid)
        self.km = None
        self.kc = None
        self.jobs = queue.Queue()
        self.jobs_mu = threading.Lock()
        self.retired = False
        threading.Thread(target=self.work, daemon=True).start()

    def work(self):
        while True:
            job = self.jobs.get()
            if job is None:
                return
            job()

    def call(self, fn):
        """Runs fn() on the context's thread; returns or raises what it did."""
        box = {}
        done = threading.Event()

        def job():
            try:
                box["value"] = fn()
            except BaseException as e:  # handed to the caller
                box["error"] = e
            done.set()

        with self.jobs_mu:
            if self.retired:
                raise Failure("NOT_FOUND", "context %s was deleted" % self.id)
            self.jobs.put(job)
        done.wait()
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def retire(self):
        """Ends the context's thread once the jobs before this are done."""
        with self.jobs_mu:
            self.retired = True
            self.jobs.put(None)

    def close(self):
        """Stops the kernel, then the context's thread."""
        self.call(self.stop)
        self.retire()

    def describe(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd,
                "created_at_ms": self.created_at_ms}

    def start(self):
        from jupyter_client import KernelManager
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        env = dict(os.environ)
        env.update(self.env)
        # Kernel state off the workspace: IPython's profile, matplotlib's
        # cache, jupyter's runtime files.
        env.setdefault("IPYTHONDIR", os.path.join(self.dir, "ipython"))
        env.setdefault("MPLCONFIGDIR", os.path.join(self.dir, "mpl"))
        env["JUPYTER_RUNTIME_DIR"] = self.dir
        env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        km = KernelManager(transport="ipc", ip=os.path.join(self.dir, "kernel"),
                           connection_file=os.path.join(self.dir, "connection.json"))
        # Tracebacks as plain text, for a model to read.
        km.start_kernel(cwd=self.cwd or None, env=env,
                        extra_arguments=["--InteractiveShell.colors=NoColor"])
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=60)
        except Exception as e:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
            raise Failure("UNAVAILABLE", "the context's kernel did not start: %s" % e)
        self.km, self.kc = km, kc

    def stop(self):
        if self.kc is not None:
            self.kc.stop_channels()
        if self.km is not None:
            try:
                self.km.shutdown_kernel(now=True)
            except Exception:
                pass
        self.km, self.kc = None, None

    def alive(self):
        return self.km is not None and self.km.is_alive()

    def run(self, code, timeout, env, max_output, send):
        """Executes `code`; sends stream and result events as they come."""
        streamed = {}
        restarted = False
        died_before = self.km is not None and not self.km.is_alive()
        if self.km is None or died_before:
            self.stop()
            self.start()
            restarted = died_before
        if env:
            # Per-run environment, set in the kernel before the code runs.
            setup = "import os as _sb_os\n" + "".join(
                "_sb_os.environ[%r] = %r\n" % (k, v) for k, v in env.items()) + "del _sb_os\n"
            self.kc.execute(setup, silent=True, store_history=False)
        start = time.monotonic()
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False)
        deadline = start + timeout
        timed_out = False
        died = False
        error = None
        interrupt_deadline = None
        while True:
            t = time.monotonic()
            if not timed_out and t >= deadline:
                timed_out = True
                self.km.interrupt_kernel()
                interrupt_deadline = t + 10
            if interrupt_deadline is not None and t >= interrupt_deadline:
                # Interrupt ignored (code that catches KeyboardInterrupt, a C
                # loop): the kernel is restarted, its state lost.
                self.stop()
                died = True
                break
            wait = (interrupt_deadline if timed_out else deadline) - t
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.01, min(wait, 0.5)))
            except queue.Empty:
                if not self.km.is_alive():
                    died = True
                    break
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            content = msg["content"]
            if kind == "stream":
                # Past the broker's output limit the text is dropped here,
                # not sent (the broker cuts the rest): a chatty loop cannot
                # flood the broker.
                name = content.get("name", "stdout")
                text = content.get("text", "")
                room = max_output - streamed.get(name, 0) if max_output > 0 else len(text)
                if room > 0:
                    streamed[name] = streamed.get(name, 0) + min(room, len(text))
                    send({"event": name, "text": text[:room]})
            elif kind in ("execute_result", "display_data"):
                send({"event": "result", "main": kind == "execute_result",
                      "data": {k: v if isinstance(v, str) else json.dumps(v)
                               for k, v in content.get("data", {}).items()}})
            elif kind == "error":
                error = {"name": content.get("ename", ""), "value": content.get("evalue", ""),
                         "traceback": content.get("traceback", [])}
            elif kind == "status" and content.get("execution_state") == "idle":
                break
        count = 0
        if not died:
            try:
                while True:
                    reply = self.kc.get_shell_msg(timeout=5)
                    if reply.get("parent_header", {}).get("msg_id") == msg_id:
                        count = reply["content"].get("execution_count", 0) or 0
                        break
            except queue.Empty:
                pass
        if timed_out and error is not None and error["name"] == "KeyboardInterrupt":
            error = None  # the interrupt was ours: timed_out says it
        return {"execution_count": count, "error": error, "timed_out": timed_out,
                "died": died, "restarted": restarted,
                "duration_ms": int((time.monotonic() - start) * 1000)}


class Supervisor:
    def __init__(self, directory, max_contexts):
        self.dir = directory
        self.max = max_contexts
        self.mu = threading.Lock()
        self.contexts = {}

    def get(self, cid):
        with self.mu:
            ctx = self.contexts.get(cid)
        if ctx is None:
            raise Failure("NOT_FOUND", "no context %s in this session" % cid)
        return ctx

    def create(self, language, cwd, env, cid=None):
        if language != "python":
            raise Failure("UNIMPLEMENTED",
                          "contexts of language %s are not supported here" % language)
        with self.mu:
            if cid is not None and cid in self.contexts:
                return self.contexts[cid]
            if len(self.contexts) >= self.max:
                raise Failure("RESOURCE_EXHAUSTED",
                              "max_contexts_per_session (%d) reached: delete a context first"
                              % self.max)
            ctx = Context(self.dir, cid or uuid.uuid4().hex[:16], language, cwd, env)
            self.contexts[ctx.id] = ctx
        try:
            ctx.call(ctx.start)
        except Exception:
            with self.mu:
                self.contexts.pop(ctx.id, None)
            ctx.retire()
            raise
        return ctx

    def handle(self, req, send):
        op = req.get("op")
        if op == "create":
            ctx = self.create(req.get("language", "python"), req.get("cwd", ""),
                              req.get("env", {}))
            return {"context": ctx.describe()}
        if op == "list":
            with self.mu:
                return {"contexts": [c.describe() for c in self.contexts.values()]}
        if op == "restart":
            ctx = self.get(req.get("id", ""))

            def restart():
                ctx.stop()
                ctx.start()

            ctx.call(restart)
            return {"context": ctx.describe()}
        if op == "delete":
            with self.mu:
                ctx = self.contexts.pop(req.get("id", ""), None)
            if ctx is not None:
                ctx.close()
            return {"existed": ctx is not None}
        if op == "run":
            cid = req.get("id", "")
            if not cid:
                # The session's default context for the language.
                language = req.get("language", "python")
                ctx = self.create(language, req.get("cwd", ""), {}, cid="default-" + language)
            else:
                ctx = self.get(cid)
            out = ctx.call(lambda: ctx.run(req.get("code", ""), float(req.get("timeout", 60)),
                                           req.get("env", {}), int(req.get("max_output", 0)),
                                           send))
            out["context"] = ctx.describe()
            return out
        raise Failure("INVALID_ARGUMENT", "unknown op %r" % op)

    def serve_one(self, conn):
        """One connection: requests one after another, each answered by its
        events, the "done" event, then an empty line (the broker keeps
        connections open between calls)."""
        f = conn.makefile("rwb")
        lock = threading.Lock()

        def send(event, end=False):
            line = (json.dumps(event) + ("\n\n" if end else "\n")).encode()
            with lock:
                f.write(line)
                f.flush()

        try:
            while True:
                line = f.readline()
                if not line:
                    break
                try:
                    req = json.loads(line)
                    if not isinstance(req, dict):
                        raise Failure("INVALID_ARGUMENT", "a request is a JSON object")
                    answer = self.handle(req, send)
                    answer.update({"event": DONE, "ok": True})
                except Failure as e:
                    answer = {"event": DONE, "ok": False, "code": e.code, "message": e.message}
                except ValueError as e:  # not JSON, a timeout that is not a number
                    answer = {"event": DONE, "ok": False, "code": "INVALID_ARGUMENT",
                              "message": str(e)}
                except Exception as e:  # a kernel manager's own failure
                    answer = {"event": DONE, "ok": False, "code": "INTERNAL",
                              "message": "%s: %s" % (type(e).__name__, e)}
                send(answer, end=True)
        except (OSError, ValueError):
            pass
        finally:
            try:
                f.close()
                conn.close()
            except OSError:
                pass


def serve(directory, max_contexts):
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, "ctl.sock")
    try:
        import jupyter_client  # noqa: F401
        import ipykernel  # noqa: F401
    except ImportError as e:
        print("missing: %s (install python3-ipykernel and python3-jupyter-client)" % e)
        sys.exit(3)
    # One supervisor per sandbox: its lock is held for its whole life. A start
    # that finds it held waits for that supervisor to listen.
    lock = os.open(os.path.join(directory, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        for _ in range(600):
            try:
                probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                probe.connect(path)
                probe.close()
                print("ready")
                sys.exit(0)
            except OSError:
                time.sleep(0.1)
        print("another context supervisor holds the lock but does not listen")
        sys.exit(1)
    try:
        os.unlink(path)  # a dead supervisor's
    except FileNotFoundError:
        pass
    read_end, write_end = os.pipe()
    if os.fork() > 0:
        # The broker's run: ends once the supervisor listens.
        os.close(write_end)
        ok = os.read(read_end, 1)
        print("ready" if ok == b"1" else "failed")
        sys.exit(0 if ok == b"1" else 1)
    os.close(read_end)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    log = os.open(os.path.join(directory, "supervisor.log"),
                  os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sup = Supervisor(directory, max_contexts)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(64)
    os.write(write_end, b"1")
    os.close(write_end)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=sup.serve_one, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit("usage: context_driver.py serve DIR MAX_CONTEXTS")
