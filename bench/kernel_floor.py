# The floor for context_bench: the same statement sent straight to an IPython
# kernel on the host (jupyter_client's blocking client, as the context
# supervisor drives its kernels), no broker, no sandbox.
#
#   /usr/bin/python3 kernel_floor.py CODE
#
# Starts one kernel and keeps it (as the broker keeps its context's). For
# each line N read on stdin it runs CODE N times (after 20 warm-up runs the
# first time) and prints one line: the p50 in microseconds, each run timed
# from execute() to the kernel's idle status and its reply.

import statistics
import sys
import time

from jupyter_client import KernelManager


def run(kc, code):
    msg_id = kc.execute(code, store_history=True, allow_stdin=False)
    while True:
        msg = kc.get_iopub_msg(timeout=30)
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
            break
    while kc.get_shell_msg(timeout=30).get("parent_header", {}).get("msg_id") != msg_id:
        pass


def main():
    code = sys.argv[1]
    km = KernelManager(transport="ipc", ip="/tmp/kernel-floor-%d" % time.time_ns())
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    try:
        for _ in range(20):
            run(kc, code)
        for line in sys.stdin:
            times = []
            for _ in range(int(line)):
                t = time.perf_counter()
                run(kc, code)
                times.append(time.perf_counter() - t)
            print(int(statistics.median(times) * 1e6), flush=True)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


if __name__ == "__main__":
    main()
