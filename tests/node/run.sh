#!/bin/sh
# CTest entry: the official openai npm client against isokv serve.
#   tests/node/run.sh PATH/TO/isokv
# Installs the pinned client with `npm ci` when node_modules is missing. Exits 77 (CTest:
# skipped, not passed) only when npm cannot reach the registry; 0 when every check holds.
# The server runs on a free loopback port and is stopped on exit, whatever happened.
set -u
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "SKIP: node/npm are not installed; the openai client test did not run"
  exit 77
fi
if [ ! -f "$here/node_modules/openai/package.json" ]; then
  if ! (cd "$here" && npm ci --no-audit --no-fund --loglevel=error); then
    if ! npm ping >/dev/null 2>&1; then
      echo "SKIP: npm cannot reach the registry; the openai client test did not run"
      exit 77
    fi
    echo "npm ci failed (the registry is reachable)"
    exit 1
  fi
fi
tmp=$(mktemp -d /tmp/ikv_node_test.XXXXXX)
printf '{"sk-node-test": "node"}' > "$tmp/keys.json"
"$bin" serve --port 0 --api-keys "$tmp/keys.json" --max-seqs 4 >"$tmp/out" 2>"$tmp/err" &
pid=$!
cleanup() {
  kill -TERM "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
port=
i=0
while [ $i -lt 300 ] && [ -z "$port" ]; do
  port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$tmp/out")
  [ -n "$port" ] || sleep 0.1
  i=$((i + 1))
done
if [ -z "$port" ]; then
  echo "isokv serve did not start:"
  cat "$tmp/err"
  exit 1
fi
node "$here/openai_test.mjs" "http://127.0.0.1:$port/v1" sk-node-test
rc=$?
[ $rc -eq 0 ] || cat "$tmp/err"
exit $rc
