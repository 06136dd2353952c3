#!/usr/bin/env python3
"""A conversation-level model of the WEKA cells: how far can ranking conversations go (issue 15)?

    scripts/weka_conv_model.py N CAPACITY_TOKENS [TRACE] [--h SECONDS]
        e.g. scripts/weka_conv_model.py 355 2000000 --h 20

In a WEKA cell each request re-reads its conversation's chain, so a cache's choice is in effect
which conversations' chains (or how much of their tails) to keep. This model keeps, per
conversation, how many blocks of its latest chain are resident (a prefix: leaf-only eviction
cuts tails); a request hits min(resident, the longest common prefix of its chain and the
previous one), then its whole chain is resident and other conversations' tails are cut, one
victim at a time, until the blocks fit. Conversations start as isokv sim starts them (i of N at
i * 3600 / N s); main-thread requests only ("n" and "s"; a subagent's nested requests are left
out). It reproduces isokv sim's block-level lru and opt within 0.3 points of token hit ratio.

Victims, in order (the request being served is never one):
  lru          the conversation accessed longest ago
  opt          the one whose next request is farthest (Belady over conversations)
  hint         one whose response ended its turn, then lru
  hazard       the smallest P(back within h | how its last response ended, idle time), h = 5 s
               (--h), the idle time counted from the end of its last response, which the
               model takes from the trace's "api_time" AT THE REQUEST'S ARRIVAL: a conversation
               whose response is still streaming counts as just idle. That is foreknowledge of
               the response's length, which no server has (it is also what isokv sim's order
               mode cannot show: there a request's blocks are locked while it runs).
  hazard-arr   the same with the idle time counted from the request's arrival: what is known
               online.
P(back within h | ...) is learned as the model runs, per stop reason, from the idle gaps seen
so far (each conversation's next request after a response), with one pseudo-observation of a
client that never returns: (F(a + h) - F(a)) / (n - F(a) + 1). Simulated (a model, not isokv);
token hit ratio and the share of the lru -> opt gap. Pure Python 3; 2M / 355 takes ~1 minute.
"""
import bisect
import math
import sys

from wekatrace import conversations

WINDOW = 3600.0
BLOCK = 64


def chains(reqs):
    """(arrival s, response time s, stop, block ids) per main-thread request."""
    out = [(float(r['t']), float(r.get('api_time', 0.0)), str(r.get('stop', '?')),
            list(r['hash_ids'])) for r in reqs]
    if not all(math.isfinite(t) and math.isfinite(a) for t, a, _, _ in out):
        raise ValueError('a time is not finite')
    return out


def load(path, n):
    convs = conversations(path, 'weka_conv_model.py', chains, n)
    if len(convs) < n:
        sys.exit(f'weka_conv_model.py: {path}: {len(convs)} conversations, {n} asked for')
    return convs


def lcp(a, b):
    i, n = 0, min(len(a), len(b))
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Gaps:
    """Idle gaps seen so far (a response's end, or its request's arrival, to the next request
    of its conversation), per stop reason, sorted."""

    def __init__(self):
        self.g = {}

    def add(self, stop, gap):
        bisect.insort(self.g.setdefault(stop, []), gap)

    def p_within(self, stop, idle, h):
        g = self.g.get(stop, [])
        a = bisect.bisect_left(g, idle)
        return (bisect.bisect_right(g, idle + h) - a) / (len(g) - a + 1)


def run(convs, cap, policy, h):
    events = sorted((i * WINDOW / len(convs) + r[0], i, j)
                    for i, reqs in enumerate(convs) for j, r in enumerate(reqs))
    nxt, seen = {}, {}
    for t, i, j in reversed(events):
        nxt[i, j] = seen.get(i, math.inf)
        seen[i] = t
    gaps = Gaps()
    res, chain, last, idle_from, stop, due = {}, {}, {}, {}, {}, {}
    used = hit = total = 0
    for t, i, j in events:
        _, api, st, ids = convs[i][j]
        if i in idle_from:
            gaps.add(stop[i], max(0.0, t - idle_from[i]))
        hit += min(res.get(i, 0), lcp(chain.get(i, []), ids))
        total += len(ids)
        used += min(len(ids), cap) - res.get(i, 0)
        res[i], chain[i] = min(len(ids), cap), ids
        last[i], stop[i], due[i] = t, st, nxt[i, j]
        idle_from[i] = t + api if policy == 'hazard' else t
        while used > cap:
            cands = [v for v in res if v != i and res[v] > 0]
            if not cands:
                break
            if policy == 'lru':
                v = min(cands, key=lambda v: last[v])
            elif policy == 'opt':
                v = max(cands, key=lambda v: due[v])
            elif policy == 'hint':
                v = min(cands, key=lambda v: (stop[v] != 'end_turn', last[v]))
            else:
                v = min(cands, key=lambda v: (gaps.p_within(stop[v], max(0.0, t - idle_from[v]), h),
                                              last[v]))
            cut = min(res[v], used - cap)
            res[v] -= cut
            used -= cut
    if total == 0:
        sys.exit('weka_conv_model.py: the requests carry no blocks (no "hash_ids")')
    return hit / total


def main():
    args, h = sys.argv[1:], 5.0
    if '--h' in args:
        i = args.index('--h')
        try:
            h = float(args[i + 1])
        except (IndexError, ValueError):
            sys.exit('weka_conv_model.py: --h takes seconds')
        del args[i:i + 2]
    if len(args) not in (2, 3):
        sys.exit('usage: scripts/weka_conv_model.py N CAPACITY_TOKENS [TRACE] [--h SECONDS]')
    try:
        n, cap_tokens = int(args[0]), float(args[1])
    except ValueError:
        sys.exit('weka_conv_model.py: N and CAPACITY_TOKENS must be numbers')
    if n < 1 or not 1 <= cap_tokens / BLOCK < 1e15 or not 0 < h < 1e9:
        sys.exit('weka_conv_model.py: N, CAPACITY_TOKENS (at least one block) and --h must be '
                 'positive and finite')
    cap = int(cap_tokens / BLOCK)
    path = args[2] if len(args) > 2 else 'data/traces/weka_cc/weka_cc_traces_part1.jsonl.gz'
    convs = load(path, n)
    hr = {p: run(convs, cap, p, h) for p in ('lru', 'opt', 'hint', 'hazard', 'hazard-arr')}
    lo, hi = hr['lru'], hr['opt']
    share = (lambda v: f'{round(100 * (v - lo) / (hi - lo)) + 0}%') if hi > lo else (lambda v: 'n/a')
    print(f'N={n} capacity={args[1]} tokens h={h:g} s (simulated, conversation-level model): ' +
          ', '.join(f'{p} {v:.4f} ({share(v)})' for p, v in hr.items()))


if __name__ == '__main__':
    main()
