#!/usr/bin/python3
"""Checks deploy/: the Kubernetes manifests hang together, the systemd unit
has its hardening, the Dockerfile uses the shared build steps, and every
example config (and the ConfigMap's) is accepted by sandbox-brokerd.

usage: validate.py BROKERD_BINARY
"""
import configparser
import glob
import json
import os
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok   {name}")
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


def load(name):
    with open(os.path.join(ROOT, "deploy", "kubernetes", name)) as f:
        return yaml.safe_load(f)


def config_ok(brokerd, text, label):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        r = subprocess.run([brokerd, "--config", path, "--check-config"],
                           capture_output=True, text=True, timeout=30)
        check(f"config loads: {label}", r.returncode == 0 and r.stdout.strip() == "config ok",
              r.stderr.strip())
    finally:
        os.unlink(path)


def main():
    brokerd = sys.argv[1]
    dep = load("deployment.yaml")
    svc = load("service.yaml")
    pdb = load("pdb.yaml")
    cm = load("configmap.yaml")
    secret = load("secret.example.yaml")
    check("kinds", [d["kind"] for d in (dep, svc, pdb, cm, secret)] ==
          ["Deployment", "Service", "PodDisruptionBudget", "ConfigMap", "Secret"])

    labels = dep["spec"]["template"]["metadata"]["labels"]
    check("deployment selector matches its pods",
          all(labels.get(k) == v for k, v in dep["spec"]["selector"]["matchLabels"].items()))
    check("service selects the pods", all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()))
    check("pdb selects the pods",
          all(labels.get(k) == v for k, v in pdb["spec"]["selector"]["matchLabels"].items()))
    check("pdb keeps one available", pdb["spec"].get("minAvailable") == 1)

    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check("grpc and metrics ports", ports == {"grpc": 50051, "metrics": 9090})
    for probe in ("readinessProbe", "livenessProbe"):
        check(f"{probe} is a gRPC health probe on the grpc port",
              c[probe].get("grpc", {}).get("port") == 50051)
    check("service ports target the named ports",
          sorted(p["targetPort"] for p in svc["spec"]["ports"]) == ["grpc", "metrics"])
    res = c.get("resources", {})
    check("resource requests and limits", {"cpu", "memory"} <= set(res.get("requests", {})) and
          {"cpu", "memory"} <= set(res.get("limits", {})))
    sc = c["securityContext"]
    check("no privilege escalation, no capabilities",
          sc.get("allowPrivilegeEscalation") is False and sc["capabilities"]["drop"] == ["ALL"] and
          "add" not in sc["capabilities"])
    check("non-root pod", pod["securityContext"].get("runAsNonRoot") is True)
    check("seccomp relaxed only as documented (user namespaces for bubblewrap)",
          sc["seccompProfile"]["type"] == "Unconfined")
    check("/proc unmasked for bubblewrap's proc mount, in a pod user namespace",
          sc.get("procMount") == "Unmasked" and pod.get("hostUsers") is False)
    check("drain fits in the termination grace period",
          pod["terminationGracePeriodSeconds"] >
          json.loads(cm["data"]["config.json"]).get("drain_grace_seconds", 30))

    secret_keys = set(secret["stringData"])
    refs = [e["valueFrom"]["secretKeyRef"] for e in c.get("env", []) if "valueFrom" in e]
    check("env references existing Secret keys",
          refs and all(r["name"] == secret["metadata"]["name"] and r["key"] in secret_keys
                       for r in refs))
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    check("every mount has a volume", set(mounts) <= set(vols))
    check("config comes from the ConfigMap",
          vols["config"]["configMap"]["name"] == cm["metadata"]["name"] and
          os.path.dirname(c["args"][c["args"].index("--config") + 1]) ==
          mounts["config"]["mountPath"] and "subPath" not in mounts["config"])
    cfg = json.loads(cm["data"]["config.json"])
    tokens_path = cfg["auth"]["tokens_file"]
    check("tokens file is mounted from the Secret",
          os.path.dirname(tokens_path) == mounts["secrets"]["mountPath"] and
          vols["secrets"]["secret"]["items"][0]["path"] == os.path.basename(tokens_path) and
          vols["secrets"]["secret"]["items"][0]["key"] in secret_keys)
    check("workspace root is on a writable volume",
          cfg["providers"]["local"]["workspace_root"].startswith(mounts["workspaces"]["mountPath"]))

    # Configs load (tokens files replaced by a real one).
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as tf:
        tf.write(secret["stringData"]["tokens.json"])
        tokens_file = tf.name
    try:
        def fixed(text):
            c = json.loads(text)
            if "auth" in c:
                c["auth"]["tokens_file"] = tokens_file
            return json.dumps(c)
        config_ok(brokerd, fixed(cm["data"]["config.json"]), "the ConfigMap")
        for path in sorted(glob.glob(os.path.join(ROOT, "deploy", "configs", "*.json"))):
            with open(path) as f:
                config_ok(brokerd, fixed(f.read()), os.path.relpath(path, ROOT))
        with open(os.path.join(ROOT, "deploy", "configs", "local.json")) as f:
            bad = json.loads(f.read())
        bad["providers"]["local"]["memry_bytes"] = 1
        bad["auth"]["tokens_file"] = tokens_file
        r = subprocess.run([brokerd, "--config", "/dev/stdin", "--check-config"],
                           input=json.dumps(bad), capture_output=True, text=True, timeout=30)
        check("a bad key is refused and named", r.returncode != 0 and
              "providers.local.memry_bytes: unknown key" in r.stderr, r.stderr)
    finally:
        os.unlink(tokens_file)

    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(os.path.join(ROOT, "deploy", "systemd", "sandbox-brokerd.service"))
    svc_sec = unit["Service"]
    for key in ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp",
                "ProtectKernelModules", "RestrictSUIDSGID", "CapabilityBoundingSet"):
        check(f"systemd hardening: {key}", key in svc_sec)
    check("systemd stops with SIGTERM and waits for the drain",
          svc_sec.get("KillSignal") == "SIGTERM" and int(svc_sec.get("TimeoutStopSec", 0)) > 30)

    with open(os.path.join(ROOT, "Dockerfile")) as f:
        docker = f.read()
    check("Dockerfile uses the shared build steps",
          "image-steps.sh build" in docker and "image-steps.sh runtime" in docker)
    check("Dockerfile: bookworm build, bookworm-slim runtime, non-root, HEALTHCHECK via sandboxctl",
          "FROM debian:bookworm AS build" in docker and "FROM debian:bookworm-slim" in docker and
          "USER 10001" in docker and "sandboxctl" in docker.split("HEALTHCHECK", 1)[1])

    check("Dockerfile: the image's config needs no file the run line does not give",
          "COPY deploy/configs/container.json /etc/sandbox-broker/config.json" in docker)
    with open(os.path.join(ROOT, "deploy", "configs", "container.json")) as f:
        image_cfg = json.load(f)
    check("image config: local provider, no tokens file", image_cfg.get("default_provider") ==
          "local" and "auth" not in image_cfg)
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        ignored = [l.strip() for l in f if l.strip() and not l.startswith("#")]
    check(".dockerignore: the context is an allow-list (no .git, no build trees)",
          ignored[0] == "*" and "!.git" not in ignored and not any(
              l.startswith("!build") for l in ignored))

    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
