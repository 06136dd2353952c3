"""Independent models of sieve, s3fifo and arc under the cache core's leaf-only rules.

Used to check the golden hit counts of tests/test_cache.c (test_golden_mooncake): it replays
tests/data/mooncake_conv_300.jsonl in trace order exactly as ikv_cache_access does (hit the
longest resident prefix, then insert the rest while holding the chain's tail; a block is
evictable when it has no resident child and is not held) and prints the blocks hit per policy
and capacity. The policies are written from the papers plus the leaf-only adaptations stated
in src/cache/policy/*.c, with plain Python lists and exact ghost lists, so agreement with the C core checks the C code under the prefix rules
(tests/test_policy_ref.c checks the flat case against brute force and libCacheSim). s3fifo and
arc look their ghosts up when the core announces the miss, before it makes room (the `miss`
op), as the C code does.

    python3 tests/tools/policy_model.py 1000 3000 5000
"""
import json, os, sys
from collections import OrderedDict

HERE = os.path.dirname(os.path.abspath(__file__))
recs = [json.loads(l)['hash_ids']
        for l in open(os.path.join(HERE, '..', 'data', 'mooncake_conv_300.jsonl'))]

class N:
    def __init__(s, id, parent, now):
        s.id, s.parent, s.last, s.nchild, s.lock, s.queued, s.hits = id, parent, now, 0, 0, False, 0

class Sieve:
    def __init__(s, cap): s.q, s.hand = [], None           # q[0] = tail (oldest)
    def admit(s, n): n.visited, n.fresh = 0, 1
    def hit(s, n): n.visited = 1
    def queue(s, n):
        if n.fresh: n.fresh = 0; s.q.append(n)
        elif s.hand is None: s.q.insert(0, n)
        else: s.q.insert(s.q.index(s.hand), n); s.hand = n
    def dequeue(s, n):
        i = s.q.index(n)
        if s.hand is n: s.hand = s.q[i + 1] if i + 1 < len(s.q) else None
        s.q.pop(i)
    def leave(s, n): pass
    def victim(s):
        if not s.q: return None
        h = s.hand if s.hand is not None else s.q[0]
        while h.visited:
            h.visited = 0
            i = s.q.index(h) + 1
            h = s.q[i] if i < len(s.q) else s.q[0]
        s.hand = h
        return h

class S3:
    def __init__(s, cap):
        s.cap, s.q, s.res, s.seq, s.pending = cap, [[], []], [0, 0], 0, None
        s.gcap, s.ghost = int(0.9 * cap), OrderedDict()
        s.msize, s.xg = cap - int(0.1 * cap), False
    def miss(s, id): s.xg = s.ghost.pop(id, None) is not None   # before room is made
    def admit(s, n):
        g = s.xg
        n.qid, n.freq = (1 if g else 0), 0
        s.seq += 1; n.seq = s.seq; s.res[n.qid] += 1
    def hit(s, n): n.freq = min(n.freq + 1, 3)
    def queue(s, n):
        q = s.q[n.qid]; i = 0
        while i < len(q) and q[i].seq < n.seq: i += 1
        q.insert(i, n)
    def dequeue(s, n): s.q[n.qid].remove(n)
    def leave(s, n):
        s.res[n.qid] -= 1
        if n is s.pending and n.qid == 0:
            s.ghost[n.id] = 1
            while len(s.ghost) > s.gcap: s.ghost.popitem(last=False)
        s.pending = None
    def tohead(s, n, q):
        s.q[n.qid].remove(n); s.res[n.qid] -= 1; n.qid = q; s.res[q] += 1
        s.seq += 1; n.seq = s.seq; s.q[q].append(n)
    def victim(s):
        S, M = s.q
        if not s.res[1] > s.msize or not M:
            while S:
                t = S[0]
                if t.freq < 2: s.pending = t; return t
                t.freq = 0; s.tohead(t, 1)
        while M:
            t = M[0]
            if t.freq == 0: s.pending = t; return t
            t.freq -= 1; s.tohead(t, 1)
        return None

class Arc:
    """FAST'03 Fig. 4: p adapted and the ghost looked up at the miss (before room is made),
    the tie rule and case IV's directory rules in victim, T1/T2 as resident counts."""
    def __init__(s, cap):
        s.c, s.t, s.res, s.p, s.b, s.pending, s.ghost_it = cap, [[], []], [0, 0], 0.0, [[], []], None, True
        s.xg = -1
    def miss(s, id):
        g = 0 if id in s.b[0] else 1 if id in s.b[1] else -1
        b1, b2 = len(s.b[0]), len(s.b[1])
        if g == 0: s.p = min(s.p + max(b2 / b1, 1), s.c)
        if g == 1: s.p = max(s.p - max(b1 / b2, 1), 0)
        if g >= 0: s.b[g].remove(id)
        s.xg = g
    def admit(s, n):
        n.l = 1 if s.xg >= 0 else 0; s.res[n.l] += 1; s.xg = -1
    def hit(s, n):
        if n.queued: s.t[n.l].remove(n)
        if n.l == 0: s.res[0] -= 1; s.res[1] += 1; n.l = 1
        if n.queued: s.t[1].append(n)
    def queue(s, n):
        q = s.t[n.l]; i = 0
        while i < len(q) and q[i].last < n.last: i += 1
        q.insert(i, n)
    def dequeue(s, n): s.t[n.l].remove(n)
    def leave(s, n):
        s.res[n.l] -= 1
        if n is not s.pending: return
        s.pending = None
        if s.ghost_it: s.b[n.l].append(n.id)
    def replace(s):
        t1 = s.res[0]
        l = 0 if (t1 >= 1 and (t1 > s.p or (s.xg == 1 and t1 == s.p))) or s.res[1] == 0 else 1
        if not s.t[l]: l = 1 - l
        s.ghost_it = True
        s.pending = s.t[l][0] if s.t[l] else None
        return s.pending
    def victim(s):
        if s.xg >= 0: return s.replace()
        t1, b1 = s.res[0], len(s.b[0])
        if t1 + b1 >= s.c:
            if b1: s.b[0].pop(0); return s.replace()
            if s.t[0]: s.ghost_it = False; s.pending = s.t[0][0]; return s.pending
            return s.replace()
        if t1 + s.res[1] + b1 + len(s.b[1]) >= 2 * s.c and s.b[1]: s.b[1].pop(0)
        return s.replace()

def run(P, cap):
    pol, nodes, hits = P(cap), {}, 0
    def refresh(n):
        want = n.lock == 0 and n.nchild == 0
        if want and not n.queued: n.queued = True; pol.queue(n)
        elif not want and n.queued: pol.dequeue(n); n.queued = False
    for r, ids in enumerate(recs):
        now = r + 1
        m = 0
        while m < len(ids) and ids[m] in nodes: m += 1
        for i in range(m):
            n = nodes[ids[i]]; n.hits += 1; pol.hit(n); n.last = now
        hits += m
        prev = nodes[ids[m - 1]] if m else None
        if prev: prev.lock += 1; refresh(prev)
        for i in range(m, len(ids)):
            if hasattr(pol, 'miss'): pol.miss(ids[i])
            full = False
            while len(nodes) >= cap:
                v = pol.victim()
                if v is None: full = True; break
                pol.dequeue(v); v.queued = False; pol.leave(v)
                del nodes[v.id]
                if v.parent: v.parent.nchild -= 1; refresh(v.parent)
            if full: break
            n = N(ids[i], prev, now); nodes[n.id] = n
            if prev: prev.nchild += 1
            pol.admit(n)
            n.lock += 1; refresh(n)
            if prev: refresh(prev); prev.lock -= 1; refresh(prev)
            prev = n
        if prev: prev.lock -= 1; refresh(prev)
    return hits

for name, P in (('sieve', Sieve), ('s3fifo', S3), ('arc', Arc)):
    print(name, *[f'{c}:{run(P, c)}' for c in map(int, sys.argv[1:])])
