#!/usr/bin/env bash
# CI's container job: the image and the Kubernetes manifests, proven with a
# real engine (Debian's podman + runc), offline but for the Debian mirror.
#
#   1. base images: debootstrap bookworm (minbase) from the mirror apt uses
#      here, imported as debian:bookworm and debian:bookworm-slim, the names
#      the Dockerfile's FROM lines use (so the Dockerfile stays valid for
#      docker with a registry, and `podman build --pull=never` works here).
#      The rootfs tarballs are cached in $CACHE and reused when present.
#   2. podman build of the Dockerfile.
#   3. the documented podman run line (docs/operations.md); wait for the image's HEALTHCHECK to pass;
#      drive it with sandboxctl from the host (python, node, shell, files, a
#      timeout); 3,000 short runs, none may fail, no zombie may be left (ps
#      inside); SIGTERM: exit 0 within the drain grace.
#   4. podman kube play of deploy/kubernetes (ConfigMap, Secret, Deployment)
#      and the same smoke checks against it.
#
# usage: deploy/podman-ci.sh [SANDBOXCTL]   (default: build/sandboxctl)
# env:   SANDBOX_BROKER_IMAGE_CACHE (default ~/.cache/sandbox-broker)
#        PODMAN_CI_RUNS (default 1000)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
T0=$(date +%s)
say() { echo "podman-ci: [$(($(date +%s) - T0))s] $*"; }
fail() {
  echo "podman-ci: FAIL: $*" >&2
  exit 1
}

SANDBOXCTL=${1:-$ROOT/build/sandboxctl}
[ -x "$SANDBOXCTL" ] || fail "no sandboxctl at $SANDBOXCTL (build it first)"
CACHE=${SANDBOX_BROKER_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sandbox-broker}
RUNS=${PODMAN_CI_RUNS:-1000}
IMAGE=sandbox-broker:0.1.0
CTR=sbci-broker-$$
WORK=$(mktemp -d /tmp/sbci-XXXXXX)
KUBE_FILE=$WORK/kube.yaml
cleanup() {
  podman rm -f -t 0 "$CTR" >/dev/null 2>&1 || true
  if [ -f "$KUBE_FILE" ]; then
    podman kube down "$KUBE_FILE" >/dev/null 2>&1 || true
    podman volume rm -f sandbox-broker sandbox-broker-secrets workspaces tmp >/dev/null 2>&1 || true
    podman secret rm sandbox-broker-secrets >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# ---- 1. base images ---------------------------------------------------------

# The Debian archive apt uses here (deb822 .sources or one-line .list), for
# the suite `bookworm`; then the matching security archive, if any.
apt_uri() {  # $1: suite
  local suite=$1 f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    case "$f" in
      *.sources)
        awk -v want="$suite" '
          function flush() { if (uris != "" && index(" " suites " ", " " want " ")) { split(uris, u, " "); print u[1]; exit } uris = ""; suites = "" }
          /^[ \t]*$/ { flush(); next }
          /^URIs:/ { sub(/^URIs:[ \t]*/, ""); uris = $0 }
          /^Suites:/ { sub(/^Suites:[ \t]*/, ""); suites = $0 }
          END { flush() }' "$f"
        ;;
      *)
        awk -v want="$suite" '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ } if ($(i + 1) == want) { print $i; exit } }' "$f"
        ;;
    esac
  done | head -n1
}

ensure_base_images() {
  local full=$CACHE/debian-bookworm-minbase.tar slim=$CACHE/debian-bookworm-slim-minbase.tar
  if [ ! -s "$full" ] || [ ! -s "$slim" ]; then
    local mirror security rootfs t
    mirror=$(apt_uri bookworm)
    security=$(apt_uri bookworm-security)
    [ -n "$mirror" ] || fail "no Debian mirror for bookworm in /etc/apt/sources.list*"
    command -v debootstrap >/dev/null || fail "debootstrap is not installed"
    say "debootstrap bookworm (minbase) from $mirror into the cache $CACHE"
    mkdir -p "$CACHE"
    rootfs=$WORK/rootfs
    t=$(date +%s)
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$WORK/debootstrap.log" 2>&1 ||
      { tail -n 30 "$WORK/debootstrap.log"; fail "debootstrap failed"; }
    {
      echo "deb $mirror bookworm main"
      echo "deb $mirror bookworm-updates main"
      [ -z "$security" ] || echo "deb $security bookworm-security main"
    } >"$rootfs/etc/apt/sources.list"
    # What Docker's debian images do: no downloaded .debs, no lists.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log
    tar -C "$rootfs" -cf "$full.tmp" . && mv "$full.tmp" "$full"
    # -slim: docs, man pages and locales are neither kept nor installed.
    cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
    find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    rm -rf "$rootfs"/usr/share/{man,groff,info,lintian,linda}/* \
      "$(find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias)"
    tar -C "$rootfs" -cf "$slim.tmp" . && mv "$slim.tmp" "$slim"
    rm -rf "$rootfs"
    say "debootstrap + tarballs: $(($(date +%s) - t)) s"
    podman rmi -f docker.io/library/debian:bookworm docker.io/library/debian:bookworm-slim \
      >/dev/null 2>&1 || true
  else
    say "reusing the cached base rootfs tarballs in $CACHE"
  fi
  local name tar
  for name in bookworm bookworm-slim; do
    tar=$full
    [ "$name" = bookworm-slim ] && tar=$slim
    if ! podman image exists "docker.io/library/debian:$name"; then
      podman import --quiet --change 'CMD ["bash"]' "$tar" "docker.io/library/debian:$name" >/dev/null
      say "imported $tar as debian:$name"
    fi
  done
}

# ---- helpers ------------------------------------------------------------------

# Runtime options this machine needs beyond the documented line, each with
# its reason.
TWEAKS=()
machine_tweaks() {
  if command -v runc >/dev/null; then
    TWEAKS+=(--runtime runc)
    say "tweak: --runtime runc (Debian's podman with the runc package; crun is not installed here)"
  fi
  # Podman as root asks for large nofile/nproc limits for each container;
  # where the machine's hard limits are lower, runc cannot set them and no
  # container starts ("error setting rlimit type 7: operation not
  # permitted"). Then every container here (run and kube play) gets the
  # engine's own hard limits, through a containers.conf of this run's.
  local probe=docker.io/library/debian:bookworm-slim
  if ! podman run --rm "${TWEAKS[@]}" "$probe" true >"$WORK/probe.log" 2>&1; then
    grep -q "error setting rlimit" "$WORK/probe.log" || { cat "$WORK/probe.log"; fail "no container starts here"; }
    local cid conmon nofile nproc
    cid=$(podman run -d "${TWEAKS[@]}" --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 "$probe" sleep 30)
    conmon=$(podman inspect "$cid" --format '{{.State.ConmonPid}}')
    nofile=$(awk '/^Max open files/ {print $5}' "/proc/$conmon/limits")
    nproc=$(awk '/^Max processes/ {print $4}' "/proc/$conmon/limits")
    podman rm -f -t 0 "$cid" >/dev/null
    printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n' \
      "$nofile" "$nofile" "$nproc" "$nproc" >"$WORK/containers.conf"
    export CONTAINERS_CONF=$WORK/containers.conf
    podman run --rm "${TWEAKS[@]}" "$probe" true || fail "containers still do not start"
    say "tweak: ulimits nofile=$nofile nproc=$nproc for every container (podman's defaults exceed this machine's hard limits, so runc could not start any container)"
  fi
  if [ ! -S /run/systemd/private ]; then
    TWEAKS+=(--health-interval disable)
    say "tweak: --health-interval disable (no systemd here, which podman needs to schedule health checks; this script runs the image's HEALTHCHECK itself with podman healthcheck run)"
  fi
}

ctl() { "$SANDBOXCTL" --addr "$ADDR" "$@"; }

# The documented checks through one address: python, node, shell, files and
# a timeout, each compared with what it must print.
smoke() {
  local label=$1 out
  out=$(ctl --session "smoke-$label" run 'import sys; print(sys.version_info[0] * 14)')
  [ "$out" = 42 ] || fail "$label: python printed '$out'"
  out=$(ctl --session "smoke-$label-node" --lang node run 'console.log([1, 2, 3].map((x) => x * 2).join(","))')
  [ "$out" = 2,4,6 ] || fail "$label: node printed '$out'"
  out=$(ctl --session "smoke-$label" shell 'echo "$((6 * 7)) $(id -u) $(pwd)"')
  [ "$out" = "42 0 /workspace" ] || [[ "$out" == "42 "*" /workspace" ]] || fail "$label: shell printed '$out'"
  ctl --session "smoke-$label" write data/hello.txt 'hello from the host' >/dev/null
  out=$(ctl --session "smoke-$label" read data/hello.txt)
  [ "$out" = "hello from the host" ] || fail "$label: read back '$out'"
  out=$(ctl --session "smoke-$label" shell 'cat data/hello.txt | wc -c')
  [ "$out" = 19 ] || fail "$label: the sandbox saw '$out' bytes"
  local rc=0
  ctl --session "smoke-$label" --timeout 2 run 'import time; time.sleep(30)' >/dev/null 2>&1 || rc=$?
  [ "$rc" = 124 ] || fail "$label: a run past its timeout exited $rc, not 124"
  out=$(ctl --session "smoke-$label" run 'import socket
try:
    socket.create_connection(("1.1.1.1", 53), 2)
    print("connected")
except OSError as e:
    print(e.strerror)')
  [ "$out" = "Network is unreachable" ] || fail "$label: the sandbox's network: '$out'"
  ctl --session "smoke-$label" close >/dev/null
  ctl --session "smoke-$label-node" close >/dev/null
  say "$label: python, node, shell, write/read, a timeout (124) and no network: ok"
}

# Zombie processes inside container $1 (ps inside).
zombies() { podman exec "$1" ps -eo stat=,pid=,ppid=,comm= | awk '$1 ~ /^Z/' || true; }

# N short runs over 4 sessions in parallel; none may fail.
many_runs() {
  local label=$1 n=$2 t
  t=$(date +%s.%N)
  seq 0 $((n - 1)) | xargs -P 4 -I{} sh -c '
    i={}; out=$("$0" --addr "$1" --session "many-$((i % 4))" shell "echo run-$i") || { echo "run $i: exit $?"; exit 255; }
    [ "$out" = "run-$i" ] || { echo "run $i printed: $out"; exit 255; }' "$SANDBOXCTL" "$ADDR" ||
    fail "$label: some of $n runs failed"
  say "$label: $n runs, none failed ($(python3 -c "import sys; print(round($(date +%s.%N) - $t, 1))") s)"
}

# No zombie in container $1 (the broker reaps on SIGCHLD, within 1 s).
no_zombies() {
  local z i
  for i in 1 2 3 4 5 6; do
    z=$(zombies "$1")
    [ -z "$z" ] && return 0
    sleep 0.5
  done
  fail "$1: zombies left: $z"
}

# Waits for the image's HEALTHCHECK command to pass in container $1:
# `podman healthcheck run` where the container carries it; a kube-played
# container does not (podman takes health checks from probes there), so
# the image's HEALTHCHECK command itself is run with podman exec.
wait_healthy() {
  local i hc=() out
  out=$(podman healthcheck run "$1" 2>&1) || true
  if [[ "$out" == *"no defined healthcheck"* ]]; then
    mapfile -t hc < <(podman image inspect "$IMAGE" --format '{{range .Config.Healthcheck.Test}}{{println .}}{{end}}' | sed '/^$/d')
    [ "${hc[0]:-}" = CMD ] || fail "the image has no exec-form HEALTHCHECK"
    hc=("${hc[@]:1}")
    say "$1: no podman health check (kube play); running the image's HEALTHCHECK command: ${hc[*]}"
  fi
  for i in $(seq 1 60); do
    if { [ ${#hc[@]} -eq 0 ] && podman healthcheck run "$1" >/dev/null 2>&1; } ||
      { [ ${#hc[@]} -gt 0 ] && podman exec "$1" "${hc[@]}" >/dev/null 2>&1; }; then
      say "$1: HEALTHCHECK ($(podman exec "$1" /opt/sandbox-broker/bin/sandboxctl --addr 127.0.0.1:50051 health)) after ${i}x0.5 s"
      return 0
    fi
    sleep 0.5
  done
  podman logs "$1" 2>&1 | tail -n 30
  fail "$1: HEALTHCHECK did not pass within 30 s"
}

# ---- 2. the image -----------------------------------------------------------------

ensure_base_images
machine_tweaks
t=$(date +%s)
say "podman build $IMAGE (build stage: sandbox-brokerd and sandboxctl only, -j2, no tests)"
# --jobs 2: the runtime stage's packages install while the build stage compiles.
# The host's compiler cache, filled by CI's quick-start build of the same
# targets with the same flags: the build stage compiles only what differs.
cache=()
if command -v ccache >/dev/null 2>&1; then
  ccdir=$(ccache -k cache_dir)
  mkdir -p "$ccdir"
  cache=(-v "$ccdir:/ccache")
fi
podman build --pull=never --format docker --jobs 2 "${cache[@]}" -t "$IMAGE" . >"$WORK/build.log" 2>&1 ||
  { tail -n 40 "$WORK/build.log"; fail "podman build failed"; }
grep -E "^(  )?(Hits|Misses|Cacheable)" "$WORK/build.log" | sed 's/^/podman-ci: ccache: /' || true
say "image built in $(($(date +%s) - t)) s; size $(podman image inspect "$IMAGE" --format '{{.Size}}' | awk '{printf "%.0f MB", $1 / 1e6}')"
# podman's complaints about the missing systemd (health timers) go to a log.
PLOG=$WORK/podman.log
uidgid=$(podman run --rm "${TWEAKS[@]}" --entrypoint id "$IMAGE" -u 2>>"$PLOG"):$(podman run --rm "${TWEAKS[@]}" --entrypoint id "$IMAGE" -g 2>>"$PLOG")
[ "$uidgid" = 10001:10001 ] || fail "the image runs as $uidgid, not 10001:10001"
debs=$(podman run --rm "${TWEAKS[@]}" --user 0 --entrypoint sh "$IMAGE" -c '{ find /var/cache/apt/archives -name "*.deb"; find /var/lib/apt/lists -type f ! -name lock; } | wc -l' 2>>"$PLOG")
[ "$debs" = 0 ] || fail "apt caches left in the image ($debs entries)"

# ---- 3. the documented run line -------------------------------------------------------

# The documented podman line, with a name and a free host port; then the
# machine's tweaks.
GRPC_PORT=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
METRICS_PORT=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ADDR=127.0.0.1:$GRPC_PORT
say "podman run (documented line) on $ADDR, metrics on 127.0.0.1:$METRICS_PORT"
podman run -d --name "$CTR" -p "127.0.0.1:$GRPC_PORT:50051" -p "127.0.0.1:$METRICS_PORT:9090" \
  --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
  --security-opt unmask=ALL \
  "${TWEAKS[@]}" "$IMAGE" >/dev/null 2>>"$PLOG" || { cat "$PLOG"; fail "podman run failed"; }
wait_healthy "$CTR"
# Whether the container's log holds a pattern. conmon writes the log behind
# the process (a line written before the health check passed, or before
# podman wait returned, may not be there yet): look for up to 10 s, and show
# the tail when it never comes. No pipe into grep -q: under pipefail, podman
# logs killed by SIGPIPE after an early match would read as a miss.
log_has() {
  local i
  for i in $(seq 1 20); do
    podman logs "$1" >"$WORK/ctr.log" 2>&1 || true
    grep -q -- "$2" "$WORK/ctr.log" && return 0
    sleep 0.5
  done
  tail -n 15 "$WORK/ctr.log"
  return 1
}
log_has "$CTR" '"event":"broker.no_auth"' || fail "no-auth warning not logged"
smoke run-line
many_runs run-line "$RUNS"
no_zombies "$CTR"
/usr/bin/python3 -c "import urllib.request, sys; sys.exit(0 if b'sandbox_broker_calls_total' in urllib.request.urlopen('http://127.0.0.1:$METRICS_PORT/metrics', timeout=5).read() else 1)" ||
  fail "no metrics on the published metrics port"
say "run-line: no zombie in the container ($(podman exec "$CTR" ps -e --no-headers | wc -l) processes)"
grace=$(podman exec "$CTR" sh -c 'grep -o "\"drain_grace_seconds\": *[0-9]*" /etc/sandbox-broker/config.json | grep -o "[0-9]*$"')
t=$(date +%s.%N)
podman kill --signal TERM "$CTR" >/dev/null
rc=$(timeout $((grace + 10)) podman wait "$CTR") || fail "not stopped within the drain grace ($grace s) + 10 s"
took=$(python3 -c "print(round($(date +%s.%N) - $t, 1))")
[ "$rc" = 0 ] || { podman logs "$CTR" | tail -n 20; fail "exit status $rc after SIGTERM"; }
log_has "$CTR" '"event":"broker.exit"' || fail "no broker.exit in the logs"
say "run-line: SIGTERM -> exit 0 in $took s (drain grace $grace s)"
podman rm "$CTR" >/dev/null 2>>"$PLOG"

# ---- 4. podman kube play of deploy/kubernetes --------------------------------------

# ConfigMap + Secret + Deployment, with what podman 4.3 (Debian 12) needs
# to play them: replicas 1 and a hostPort for the grpc port (one pod,
# reached from the host); the Secret (a random token in it) created with
# `podman secret create` (this kube play takes Pods, Deployments,
# ConfigMaps and PVCs only), its values as plain `data`; ConfigMap/Secret volumes with defaultMode 0755
# (podman applies it to the volume's directory too, which a non-root
# container could not enter otherwise); the seccomp annotation (podman
# does not read seccompProfile); procMount: Unmasked applied by a runc
# wrapper exactly as a kubelet applies it (no masked or read-only /proc
# paths; podman ignores the field); --userns host when /etc/subuid has
# no range for podman's "containers" user (hostUsers: false needs one).
KPORT=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
TOKEN=sbci-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
SECRET_FILE=$WORK/secret.yaml
/usr/bin/python3 - "$ROOT/deploy/kubernetes" "$KUBE_FILE" "$SECRET_FILE" "$KPORT" "$TOKEN" <<'EOF'
import json, sys, yaml
src, out, secret_out, port, token = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
def load(name):
    with open(f"{src}/{name}") as f:
        return yaml.safe_load(f)
cm, secret, dep = load("configmap.yaml"), load("secret.example.yaml"), load("deployment.yaml")
secret["stringData"]["tokens.json"] = json.dumps({token: "ci-tenant"})
# podman 4.3 reads a Secret's `data` verbatim (no base64 decoding) and
# ignores `stringData`.
secret["data"] = secret.pop("stringData")
with open(secret_out, "w") as f:
    yaml.safe_dump(secret, f)
dep["spec"]["replicas"] = 1
pod = dep["spec"]["template"]["spec"]
for p in pod["containers"][0]["ports"]:
    if p["name"] == "grpc":
        p["hostPort"] = port
        p["hostIP"] = "127.0.0.1"
# podman 4.3 reads seccomp from the (pre-1.19) annotation, not from
# securityContext.seccompProfile.
dep["spec"]["template"]["metadata"].setdefault("annotations", {})[
    "seccomp.security.alpha.kubernetes.io/pod"] = "unconfined"
# podman 4.3 ignores securityContext.procMount: the runtime wrapper below
# applies it, for the containers that ask for it.
for c in pod["containers"]:
    if c.get("securityContext", {}).get("procMount") == "Unmasked":
        c.setdefault("env", []).append({"name": "SANDBOX_BROKER_CI_PROC_MOUNT", "value": "Unmasked"})
for v in pod["volumes"]:
    for kind in ("configMap", "secret"):
        if kind in v:
            v[kind]["defaultMode"] = 0o755
with open(out, "w") as f:
    yaml.safe_dump_all([cm, dep], f)
EOF
SECRET_NAME=$(awk '/^  name:/ {print $2; exit}' "$SECRET_FILE")
podman secret rm "$SECRET_NAME" >/dev/null 2>&1 || true
podman secret create "$SECRET_NAME" "$SECRET_FILE" >/dev/null
# procMount: Unmasked, as the kubelet does it: the container's OCI spec
# gets no masked and no read-only paths. Only for containers the manifest
# marks so (the env variable above), through a runc wrapper this run's
# containers.conf names.
cat >"$WORK/runc-procmount" <<'EOF'
#!/bin/bash
bundle="" prev=""
for a in "$@"; do
  case "$prev" in --bundle | -b) bundle=$a ;; esac
  case "$a" in --bundle=*) bundle=${a#--bundle=} ;; esac
  prev=$a
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
  /usr/bin/python3 - "$bundle/config.json" <<'PY'
import json, sys
path = sys.argv[1]
with open(path) as f:
    spec = json.load(f)
if "SANDBOX_BROKER_CI_PROC_MOUNT=Unmasked" in spec.get("process", {}).get("env", []):
    spec["linux"]["maskedPaths"] = []
    spec["linux"]["readonlyPaths"] = []
    with open(path, "w") as f:
        json.dump(spec, f)
PY
fi
exec runc "$@"
EOF
chmod +x "$WORK/runc-procmount"
{
  [ -z "${CONTAINERS_CONF:-}" ] || cat "$CONTAINERS_CONF"
  printf '[engine]\nruntime = "runc-procmount"\n[engine.runtimes]\nrunc-procmount = ["%s"]\n' "$WORK/runc-procmount"
} >"$WORK/containers-kube.conf"
export CONTAINERS_CONF=$WORK/containers-kube.conf
say "tweak: kube play through a runc wrapper that applies procMount: Unmasked (podman 4.3 ignores the field)"
KUBE_OPTS=()
if ! grep -q '^containers:' /etc/subuid 2>/dev/null; then
  KUBE_OPTS+=(--userns host)
  say "tweak: kube play --userns host (no subuid range for podman's \"containers\" user here, which hostUsers: false needs)"
fi
say "podman kube play deploy/kubernetes (ConfigMap, Deployment; Secret $SECRET_NAME) on 127.0.0.1:$KPORT"
podman kube play "${KUBE_OPTS[@]}" "$KUBE_FILE" >"$WORK/kube.log" 2>&1 ||
  { cat "$WORK/kube.log"; fail "podman kube play failed"; }
KCTR=$(podman ps --format '{{.Names}}' | grep -- '^sandbox-broker-pod-0-broker$' | head -n1)
[ -n "$KCTR" ] || { podman ps -a; fail "no broker container after kube play"; }
ADDR=127.0.0.1:$KPORT
wait_healthy "$KCTR"
rc=0
ctl run 'print(1)' >/dev/null 2>&1 || rc=$?
[ "$rc" = 69 ] || fail "kube: a call without the Secret's token was not refused (exit $rc)"
export SANDBOX_BROKER_TOKEN=$TOKEN
smoke kube
many_runs kube 300
no_zombies "$KCTR"
podman kube down "$KUBE_FILE" >/dev/null 2>>"$PLOG"
say "kube: token from the Secret, config from the ConfigMap, smoke checks and 300 runs: ok"
say "done in $(($(date +%s) - T0)) s"
