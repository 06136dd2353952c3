#!/bin/bash
# Tables and a plot of a live paradox sweep (scripts/load_weka_paradox.sh OUT): for every point
# OUT/CFG_nN it replays OUT/CFG_nN/sent.jsonl through `isokv sim` again (so the figures are the
# current simulator's) in order mode and in timed mode with the measured service times, and
# prints one markdown row per point; with PNG, gnuplot draws the live and timed-sim curves.
#
#   scripts/load_paradox_table.sh BIN OUT [PNG [TITLE]]
set -eu
[ $# -ge 2 ] || { sed -n 2,7p "$0"; exit 2; }
python3 - "$@" <<'PY'
import json, os, re, subprocess, sys
binp, out = sys.argv[1], sys.argv[2]
png = sys.argv[3] if len(sys.argv) > 3 else None
title = sys.argv[4] if len(sys.argv) > 4 else out
cfgs = ["lru", "value", "tier-mem", "tier-file", "tier-redis"]
pts = {}
for name in os.listdir(out):
    m = re.fullmatch(r"(.+)_n(\d+)", name)
    if m and os.path.exists(os.path.join(out, name, "summary.json")):
        pts.setdefault(m.group(1), []).append(int(m.group(2)))

def sim(d, pol, cap, mode):
    a = [binp, "sim", os.path.join(d, "sent.jsonl"), "--policy", pol, "--pin-public", "--json"] + cap + mode
    return json.loads(subprocess.run(a, check=True, capture_output=True, text=True).stdout)

print("| remedy | N | ok / requests | cache share of working set | live (measured) | sim order | sim timed, measured service | live - timed | live: found in the tier, recomputed | TTFT p50 / p99 ms (measured) |")
print("|---|---|---|---|---|---|---|---|---|---|")
curves = {}
for cfg in [c for c in cfgs if c in pts] + sorted(c for c in pts if c not in cfgs):
    for n in sorted(pts[cfg]):
        d = os.path.join(out, f"{cfg}_n{n}")
        s = json.load(open(os.path.join(d, "summary.json")))
        so = open(os.path.join(d, "serve.out")).read()
        cache = int(re.search(r"cache (\d+) blocks", so).group(1))
        bt = json.loads(open(os.path.join(d, "sent.jsonl")).readline())["block_tokens"]
        pol = "value" if cfg.startswith("value") else "lru"
        cap = ["--capacity-tokens", str(cache * bt)]
        if cfg == "tier-mem": cap = ["--tiers", f"hbm={cache * bt},dram=1M"]
        if cfg == "tier-file": cap = ["--tiers", f"hbm={cache * bt},ssd=1M"]
        if cfg == "tier-redis": cap = ["--tiers", f"hbm={cache * bt},remote=1M"]
        o = sim(d, pol, cap, ["--mode", "order"])
        t = sim(d, pol, cap, ["--mode", "timed", "--service", "trace"])
        ws = sim(d, pol, ["--capacity-tokens", "0"], ["--mode", "order"])  # distinct blocks
        distinct = ws["inserted_blocks"]
        P = s["prompt_tokens"]
        live, ro, rt = s["cached_tokens"] / P, o["hit_tokens"] / P, t["hit_tokens"] / P
        tt = s["ttft_s"]
        # blocks the server found in a lower tier but recomputed (it measured that as faster)
        rec = sum(int(x) for x in re.findall(r"tier_recomputed=(\d+)", open(os.path.join(d, "serve.err")).read()))
        recs = f"{rec / P:.4f}" if "tier" in cfg else "-"
        print(f"| {cfg} | {n} | {s['ok']} / {s['requests']} | {min(1, cache / max(1, distinct)):.2f} "
              f"| {live:.4f} | {ro:.4f} | {rt:.4f} | {live - rt:+.4f} | {recs} | {tt['p50'] * 1e3:.1f} / {tt['p99'] * 1e3:.1f} |")
        curves.setdefault(cfg, []).append((n, live, rt, ro))
if png:
    dat = png + ".dat"
    with open(dat, "w") as f:
        for cfg, rows in curves.items():
            f.write(f"# {cfg}\n" + "".join(f"{n} {l} {t} {o}\n" for n, l, t, o in rows) + "\n\n")
    plots = []
    for i, cfg in enumerate(curves):
        plots.append(f"'{dat}' index {i} using 1:2 with linespoints lw 2 lc {i + 1} title '{cfg} (live)'")
        plots.append(f"'{dat}' index {i} using 1:3 with lines dt 2 lw 2 lc {i + 1} title '{cfg} (sim timed)'")
    title = title.replace("'", "")
    gp = (f"set terminal pngcairo size 900,560 font ',10'\nset output '{png}'\nset title \"{title}\" noenhanced\n"
          "set xlabel 'conversations interleaved (N)'\nset ylabel 'token hit ratio'\nset logscale x 2\n"
          "set grid\nset key bottom left\nplot " + ", \\\n     ".join(plots) + "\n")
    subprocess.run(["gnuplot"], input=gp, text=True, check=True)
    os.remove(dat)
PY
