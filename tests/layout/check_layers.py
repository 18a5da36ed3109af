#!/usr/bin/env python3
"""The rooms of protocol/ and server/ depend only downwards (docs/development.md
"Layout"): a file in a room includes headers of its own room or of rooms
listed before it, never after; client/ includes nothing from server/."""
import os
import re
import sys

ROOMS = [  # bottom first
    "protocol", "server/store", "server/store/etcd", "server/telemetry", "server/config",
    "server/sessions", "server/operators", "server/cluster", "server/core",
    "server/transport/grpc", "server/transport/mcp", "server/app",
]
root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../..")
include = re.compile(r'^#include "((?:protocol|server)/[^"]+)/[^/"]+\.h"', re.M)
bad = []
for room in ROOMS + ["client"]:
    folder = os.path.join(root, room)
    for name in sorted(os.listdir(folder)):
        if not name.endswith((".h", ".cc")):
            continue
        text = open(os.path.join(folder, name), encoding="utf-8").read()
        for dep in include.findall(text):
            if room == "client":
                if dep.startswith("server"):
                    bad.append(f"{room}/{name} includes from {dep}/ (client/ must not)")
                continue
            if dep not in ROOMS:
                bad.append(f"{room}/{name} includes from {dep}/, not a room")
            elif ROOMS.index(dep) > ROOMS.index(room):
                bad.append(f"{room}/{name} includes from {dep}/, a room above it")
for b in bad:
    print(b)
print(f"check_layers: {len(bad)} upward includes")
sys.exit(1 if bad else 0)
