#!/usr/bin/env bash
# CI's quick-start job: the README's first command the way a newcomer runs
# it, as root, from a clone in root's home (/root is mode 0700, so the
# sandbox's own uid cannot reach anything in the clone by path), then the
# README's first `sandboxctl run`. Prints the time from clone to the first
# answered run.
#
# usage: scripts/ci-quickstart.sh [COPY_SANDBOXCTL_TO]
#   COPY_SANDBOXCTL_TO: where to leave the clone's sandboxctl (CI's podman
#   job drives the image with it), since the clone is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
t0=$(date +%s)
say() { echo "ci-quickstart: [$(($(date +%s) - t0))s] $*"; }
fail() {
  echo "ci-quickstart: FAIL: $*" >&2
  [ -f "${log:-}" ] && tail -20 "$log" >&2
  exit 1
}
[ "$(id -u)" -eq 0 ] || fail "run as root (the newcomer of the README's quick start is root)"
home=$(mktemp -d /root/sbqs-XXXXXX)  # mode 0700, as /root itself
clone=$home/project
log=$home/broker.log
had_state=false
[ -e /var/lib/sandbox-broker ] && had_state=true
pid=""
cleanup() {
  if [ -n "$pid" ]; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$home"
  $had_state || rm -rf /var/lib/sandbox-broker
}
trap cleanup EXIT

git clone -q --no-hardlinks "$src" "$clone"
say "cloned into $clone (parents: $(stat -c %a /root) /root, $(stat -c %a "$home") $home)"
(cd "$clone" && QUICKSTART_NO_SERVE=1 bash scripts/quickstart.sh) >"$home/build.log" 2>&1 ||
  { tail -30 "$home/build.log" >&2; fail "scripts/quickstart.sh did not build"; }
say "built"
# What the quick start then execs, as it does it (default config: the local
# provider on 127.0.0.1:50051, strict enforcement).
(cd "$clone" && exec ./build/sandbox-brokerd) 2>"$log" &
pid=$!
ctl=$clone/build/sandboxctl
out=""
for _ in $(seq 600); do
  kill -0 "$pid" 2>/dev/null || fail "sandbox-brokerd exited at start"
  if out=$("$ctl" run 'print(6 * 7)' 2>&1); then break; fi
  sleep 0.1
done
[ "$out" = 42 ] || fail "sandboxctl run 'print(6 * 7)' printed '$out', not 42"
say "first answered sandboxctl run: $out (clone to answer: $(($(date +%s) - t0)) s)"
node_out=$("$ctl" --lang node run 'console.log(1 + 1)')
[ "$node_out" = 2 ] || fail "node run printed '$node_out'"
"$ctl" close >/dev/null
# Run as a plain user, the daemon refuses in one line that says what to do.
nr=$(mktemp -d /tmp/sbqs-nonroot-XXXXXX)
chmod 755 "$nr"
cp "$clone/build/sandbox-brokerd" "$clone/build/sandbox-init" "$nr/"
set +e
(cd "$nr" && setpriv --reuid 65534 --regid 65534 --clear-groups env HOME="$nr" \
  ./sandbox-brokerd --listen 127.0.0.1:0) >"$nr/out" 2>"$nr/err"
rc=$?
set -e
refusal=$(grep -v '^[0-9T:.-]*Z info ' "$nr/err" || true)
rm -rf "$nr"
[ "$rc" -eq 2 ] || fail "as a plain user: exit $rc, not 2"
[ "$(printf '%s\n' "$refusal" | wc -l)" -eq 1 ] || fail "as a plain user, more than one line: $refusal"
case "$refusal" in
  *sudo*best_effort*) say "as a plain user: $refusal" ;;
  *) fail "as a plain user, the refusal does not say what to do: $refusal" ;;
esac
[ -z "${1:-}" ] || install -m 0755 "$ctl" "$1"
say "passed"
