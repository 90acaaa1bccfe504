#!/usr/bin/env bash
# The README's quickstart, run as README states it (issue #12: "the quickstart run on a
# fresh clone exactly as README states it"): the first shell block of README.md that runs
# `slrp standalone` is read, the lines before that command are run as written (builds;
# a test command there is left to the test section of .ci/run), then the `slrp standalone`
# line itself in the background. Then, as a user would: `slrp ctl status` until READY, a
# disk created and destroyed, SIGTERM, exit status 0. Any failure prints the daemon's log.
#
# As root, `sudo` in README's lines runs the command itself (CI machines may have no sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

# SLRP_QUICKSTART_README: another file, to try this script on a draft of the README.
README=${SLRP_QUICKSTART_README:-README.md}
DEFAULT_STATE=/var/lib/slrp
# READY once the daemon runs (FIXED defaults: "READY within a few seconds"); a build in
# README's line comes before and has its own bound.
READY_SECONDS=60
BUILD_SECONDS=1800

fail() {
  echo "quickstart: $*" >&2
  exit 1
}

[ "$(id -u)" = 0 ] || fail "needs root (slrp standalone mounts volumes)"

# The block: lines of the first fenced shell block naming `slrp standalone`, continuation
# lines joined, `$ ` prompts and comment lines dropped.
mapfile -t lines < <(awk '
  /^[[:space:]]*```/ {
    if (inblock) { if (found) { printf "%s", buf; exit } inblock = 0; buf = "" }
    else if ($0 ~ /^[[:space:]]*```(sh|bash|shell|console)?[[:space:]]*$/) { inblock = 1 }
    next
  }
  inblock {
    line = $0
    sub(/^[[:space:]]*\$ /, "", line)
    if (cont != "") { line = cont " " line; cont = "" }
    if (line ~ /\\$/) { sub(/\\$/, "", line); cont = line; next }
    if (line ~ /^[[:space:]]*(#|$)/) next
    buf = buf line "\n"
    if (line ~ /slrp standalone/) found = 1
  }
' "$README")
[ "${#lines[@]}" -gt 0 ] || fail "no shell block in $README runs \`slrp standalone\`"

setup=()
standalone=""
for line in "${lines[@]}"; do
  if [[ "$line" == *"slrp standalone"* ]]; then
    standalone="$line"
    break
  fi
  setup+=("$line")
done
echo "quickstart: README's command: $standalone"

# As root `sudo CMD` is CMD; `exec` so that the daemon is the background job itself.
run_line() {
  bash -c 'sudo() { exec "$@"; }; '"$1"
}

for line in "${setup[@]}"; do
  case "$line" in
    *nextest*|*"cargo test"*) echo "quickstart: (tests run later) $line"; continue ;;
  esac
  echo "quickstart: + $line"
  timeout "$BUILD_SECONDS" bash -c 'sudo() { "$@"; }; '"$line"
done

log=$(mktemp /tmp/slrp-quickstart.XXXXXX.log)
state_existed=false
[ -e "$DEFAULT_STATE" ] && state_existed=true
started=$(date +%s)
run_line "$standalone" >"$log" 2>&1 &
job=$!
daemon=""
slrp=""

show_log() {
  echo "---- daemon log ($log) ----" >&2
  cat "$log" >&2
  echo "---- end of daemon log ----" >&2
}

cleanup() {
  local rc=$?
  if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
    kill -TERM "$daemon" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$daemon" 2>/dev/null || true
  fi
  kill -KILL "$job" 2>/dev/null || true
  if [ "$rc" != 0 ]; then
    show_log
  fi
  exit "$rc"
}
trap cleanup EXIT

# The daemon: the job or a descendant (a build or `cargo run` in README's line comes
# first) whose program is `slrp` and whose arguments say `standalone`.
descendants() {
  local pid
  for pid in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
    echo "$pid"
    descendants "$pid"
  done
}
find_daemon() {
  local pid
  for pid in "$job" $(descendants "$job"); do
    [ "$(basename "$(readlink "/proc/$pid/exe" 2>/dev/null)")" = slrp ] || continue
    if tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qx standalone; then
      echo "$pid"
      return
    fi
  done
}

while [ -z "$daemon" ]; do
  if ! kill -0 "$job" 2>/dev/null; then
    rc=0
    wait "$job" || rc=$?
    fail "README's command exited (status $rc) before the daemon was READY"
  fi
  [ $(($(date +%s) - started)) -lt "$BUILD_SECONDS" ] || fail "no slrp standalone process after ${BUILD_SECONDS}s"
  daemon=$(find_daemon)
  [ -n "$daemon" ] || sleep 0.2
done
slrp=$(readlink "/proc/$daemon/exe")
# The state directory README's command uses: its --state-dir, else the default.
state=$(tr '\0' '\n' <"/proc/$daemon/cmdline" | awk 'prev == "--state-dir" { print; exit } { prev = $0 }')
state=${state:-$DEFAULT_STATE}
ctl=("$slrp" ctl)
[ "$state" = "$DEFAULT_STATE" ] || ctl+=(--admin "$state/admin.sock")
echo "quickstart: daemon $daemon ($slrp), state $state"

ready_since=$(date +%s)
until "${ctl[@]}" --json status 2>/dev/null \
  | python3 -c 'import json, sys; sys.exit(0 if json.load(sys.stdin).get("ready") is True else 1)' 2>/dev/null; do
  kill -0 "$daemon" 2>/dev/null || fail "the daemon exited before READY"
  [ $(($(date +%s) - ready_since)) -lt "$READY_SECONDS" ] || fail "not READY after ${READY_SECONDS}s"
  sleep 0.2
done
echo "quickstart: READY after $(($(date +%s) - ready_since))s"
"${ctl[@]}" status

# The storage pools follow READY: the profile watch starts at the first READY (as in
# Mesos, spec §3.6) and its reconciliation adds one pool per profile.
until "${ctl[@]}" --json resources 2>/dev/null \
  | python3 -c 'import json, sys; sys.exit(0 if any(r.get("disk", {}).get("source", {}).get("profile") == "mount" and r["disk"]["source"].get("id") is None for r in json.load(sys.stdin)) else 1)' 2>/dev/null; do
  kill -0 "$daemon" 2>/dev/null || fail "the daemon exited before offering the mount pool"
  [ $(($(date +%s) - ready_since)) -lt "$READY_SECONDS" ] || fail "no mount pool after ${READY_SECONDS}s"
  sleep 0.2
done
"${ctl[@]}" resources

op=$("${ctl[@]}" --json create-disk --profile mount --size 64MiB --wait) || fail "create-disk failed: $op"
volume=$(python3 -c 'import json, sys; op = json.loads(sys.argv[1]); assert op["state"] == "OPERATION_FINISHED", op; print(op["volume_id"])' "$op") \
  || fail "create-disk did not finish: $op"
echo "quickstart: created $volume"
"${ctl[@]}" volumes
"${ctl[@]}" destroy-disk "$volume" --wait || fail "destroy-disk $volume failed"
echo "quickstart: destroyed $volume"

kill -TERM "$daemon"
status=0
wait "$job" || status=$?
if [ "$status" != 0 ]; then
  fail "the daemon exited with status $status after SIGTERM"
fi
daemon=""
echo "quickstart: stopped cleanly after $(($(date +%s) - ready_since))s"

# A state directory this run created goes with it (nothing is mounted under it once the
# disk is destroyed and the daemon stopped).
if [ "$state_existed" = false ] && [ "$state" = "$DEFAULT_STATE" ]; then
  if grep -q " $DEFAULT_STATE[/ ]" /proc/self/mountinfo; then
    echo "quickstart: warning: something is still mounted under $DEFAULT_STATE; left in place" >&2
  else
    rm -rf "$DEFAULT_STATE"
  fi
fi
rm -f "$log"
