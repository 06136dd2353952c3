#!/bin/bash
# The users paradox live on WEKA (docs/load.md): the first N conversations of the bundled WEKA
# slice, their first T requests each (subagents left out), scale 64 (64-token trace blocks ->
# 1 token; the server's blocks are 1 token, so block for block the same cache), interleaved in
# one hour, closed loop with C in flight, through one `isokv serve` with a fixed cache, for each
# remedy; a fresh server per point. Each point is scripts/load_fidelity.sh (server, load,
# /metrics, `isokv sim --mode order` on sent.jsonl); the timed-mode predictions are added by
# running scripts/load_sim_timed.sh on OUT afterwards.
#
#   scripts/load_weka_paradox.sh BIN OUT [CONFIGS]   CONFIGS: lru value tier-mem tier-file tier-redis
# (tier-redis starts a redis-server of its own on a free loopback port, emptied per point)
#
# Needs a long-context model: `isokv model init --config tiny --seq-len 4096 -o M --tokenizer-out
# T`, given as IKV_MODEL=M IKV_TOKENIZER=T. Knobs (environment): NS (1 4 16 64 128), T (3),
# C (4), KV (12582912 bytes: 16,384 blocks of 768 B, half cache, half private), W (3600: the
# N conversations start evenly within W seconds).
set -eu
[ $# -ge 2 ] || { sed -n 2,16p "$0"; exit 2; }
bin=$1 out=$2
shift 2
configs=${*:-lru value tier-mem tier-file}
root=$(cd "$(dirname "$0")/.." && pwd)
: "${IKV_MODEL:?set IKV_MODEL to a long-context checkpoint (see the header)}"
NS=${NS:-1 4 16 64 128} T=${T:-3} C=${C:-4} KV=${KV:-12582912} W=${W:-3600}
mkdir -p "$out"
trace=$out/weka_t$T.jsonl
python3 - "$root/data/traces/weka_cc/weka_cc_traces_part1.jsonl.gz" "$trace" "$T" <<'PY'
import gzip, json, sys
src, dst, t = sys.argv[1], sys.argv[2], int(sys.argv[3])
with gzip.open(src, "rt") as f, open(dst + ".tmp", "w") as o:
    for i, line in enumerate(f):
        if i >= 128: break
        d = json.loads(line)
        d["requests"] = [r for r in d["requests"] if r.get("type") != "subagent"][:t]
        o.write(json.dumps(d) + "\n")
import os; os.replace(dst + ".tmp", dst)
PY
redis_pid=""
trap '[ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null; true' EXIT
for cfg in $configs; do
  pol=lru extra="" simcap=""
  # a 256M lower tier holds every block of the sweep (768 B each): dram=1M blocks in the sim
  case $cfg in
    lru) ;;
    value) pol=value ;;
    tier-mem) extra="--tier mem:256M" simcap="--tiers hbm=8192,dram=1M" ;;
    tier-file) extra="--tier file:$out/tier.kv:256M" simcap="--tiers hbm=8192,ssd=1M" ;;
    tier-redis)
      if [ -z "$redis_pid" ]; then
        rport=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
        redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no > "$out/redis.log" 2>&1 &
        redis_pid=$!
        for _ in $(seq 50); do redis-cli -p "$rport" ping > /dev/null 2>&1 && break; sleep 0.1; done
      fi
      extra="--tier redis://127.0.0.1:$rport:256M" simcap="--tiers hbm=8192,remote=1M" ;;
    *) echo "unknown config $cfg" >&2; exit 2 ;;
  esac
  for n in $NS; do
    [ "$cfg" = tier-file ] && rm -f "$out/tier.kv"
    [ "$cfg" = tier-redis ] && redis-cli -p "$rport" flushall > /dev/null
    c=$C; [ "$n" -lt "$c" ] && c=$n
    IKV_SERVE_ARGS="--block-tokens 1 --max-seqs 4 $extra" IKV_SIM_CAP=$simcap \
        "$root/scripts/load_fidelity.sh" "$bin" "$out" "${cfg}_n$n" "$trace" "$pol" "$KV" "$c" \
        --conversations "$n" --window "$W" --scale 64 --max-context 4096 --max-output 4 \
        --timeout 300
  done
done
