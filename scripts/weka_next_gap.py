#!/usr/bin/env python3
"""How much a WEKA request's own fields tell of when its conversation comes back (issue 15).

    scripts/weka_next_gap.py [TRACE]     default: data/traces/weka_cc/weka_cc_traces_part1.jsonl.gz

The horizon-bit oracle (docs/policies.md, "What the WEKA gap is made of") says most of the
WEKA LRU -> opt gap is one bit per chain: does its conversation send its next request before the
cache would drop it. This measures, on the trace's own fields and independently of any cache,
how much of that bit is predictable when a response ends: for each main-thread request ("n" and
"s" types; a subagent's nested requests are their own threads) the label is "the conversation's
next request starts more than tau seconds after this response ended, or never comes", for tau =
30, 120, 300 and 900 s. Each feature set is scored by the cross-entropy (bits per request) of
its predictions on conversations it was not fitted on (2-fold, split by conversation, seeded),
against the label's entropy H: the share (H - loss) / H is the part of the bit it recovers.
Two models: a table per bucket of the features (Laplace-shrunk to the prior) and a logistic
regression over one-hot features and their products with the stop reason (SGD, 15 epochs), which
can use many fields without the table's overfitting. Pure Python 3 (no numpy); ~35 s.
Measured, simulated nothing: it reads the trace only.
"""
import math
import random
import sys

from wekatrace import conversations

FIELDS = {
    'stop': 'how the response ended (tool_use, end_turn, ...)',
    'last': 'the conversation\'s previous idle gap (log2 s)',
    'turn': 'the request\'s index in its conversation (log2)',
    'out': 'output tokens (log2)',
    'api': 'API time of the response (log2 s)',
    'otyp': 'output block types (text, thinking, tool_use)',
    'ityp': 'input block types (text, tool_result)',
    'in': 'input tokens (log2)',
}
SETS = [
    ('none (the prior)', []),
    ('stop', ['stop']),
    ('stop, last gap', ['stop', 'last']),
    ('stop, last gap, turn', ['stop', 'last', 'turn']),
    ('every field', list(FIELDS)),
]
TAUS = (30, 120, 300, 900)


def log2b(x):
    return int(math.log2(max(0.0, float(x)) + 1))


def features(reqs):
    """(features, idle gap in s or None for the last request) per request of a conversation."""
    rows, prev = [], None
    for i, r in enumerate(reqs):
        end = float(r['t']) + float(r.get('api_time', 0.0))
        gap = max(0.0, float(reqs[i + 1]['t']) - end) if i + 1 < len(reqs) else None
        feats = {
            'stop': str(r.get('stop', '?')),
            'last': None if prev is None else log2b(prev),
            'turn': min(log2b(i), 8),
            'out': log2b(r.get('out', 0)),
            'api': log2b(r.get('api_time', 0)),
            'otyp': ','.join(sorted(map(str, r.get('output_types', [])))),
            'ityp': ','.join(sorted(map(str, r.get('input_types', [])))),
            'in': log2b(r.get('in', 0)),
        }
        rows.append((feats, gap))
        prev = gap
    return rows


def load(path):
    """Rows of (conversation number, features, idle gap in s or None for the last request)."""
    convs = conversations(path, 'weka_next_gap.py', features)
    rows = [(ci, f, g) for ci, conv in enumerate(convs, 1) for f, g in conv]
    if not rows:
        sys.exit(f'weka_next_gap.py: {path}: no requests')
    return rows


def entropy(p):
    return 0.0 if p <= 0 or p >= 1 else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def xent(p, y):
    p = min(max(p, 1e-6), 1 - 1e-6)
    return -math.log2(p if y else 1 - p)


def table_loss(rows, labels, fold, keys, prior):
    loss = 0.0
    for k in (0, 1):
        cnt = {}
        for (c, f, _), y in zip(rows, labels):
            if fold[c] != k:
                b = tuple(f[x] for x in keys)
                n1, n = cnt.get(b, (0, 0))
                cnt[b] = (n1 + y, n + 1)
        for (c, f, _), y in zip(rows, labels):
            if fold[c] == k:
                n1, n = cnt.get(tuple(f[x] for x in keys), (0, 0))
                loss += xent((n1 + 2 * prior) / (n + 2), y)
    return loss / len(rows)


def onehot(f, keys):
    out = ['bias']
    for k in keys:
        out.append(f'{k}={f[k]}')
        if k != 'stop':
            out.append(f'stop={f["stop"]}&{k}={f[k]}')
    return out


def logistic_loss(rows, labels, fold, keys, seed):
    rng = random.Random(seed)
    loss = 0.0
    for k in (0, 1):
        w = {}
        train = [(onehot(f, keys), y) for (c, f, _), y in zip(rows, labels) if fold[c] != k]
        for _ in range(15):
            rng.shuffle(train)
            for x, y in train:
                z = max(-30.0, min(30.0, sum(w.get(j, 0.0) for j in x)))
                g = 1 / (1 + math.exp(-z)) - y
                for j in x:
                    w[j] = w.get(j, 0.0) - 0.05 * (g + 1e-4 * w.get(j, 0.0))
        for (c, f, _), y in zip(rows, labels):
            if fold[c] == k:
                z = max(-30.0, min(30.0, sum(w.get(j, 0.0) for j in onehot(f, keys))))
                loss += xent(1 / (1 + math.exp(-z)), y)
    return loss / len(rows)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else 'data/traces/weka_cc/weka_cc_traces_part1.jsonl.gz'
    if len(sys.argv) > 2 or path in ('-h', '--help'):
        sys.exit(__doc__.strip().splitlines()[2].strip())
    rows = load(path)
    convs = sorted({c for c, _, _ in rows})
    random.Random(1).shuffle(convs)
    fold = {c: i % 2 for i, c in enumerate(convs)}
    print(f'{path}: {len(rows)} main-thread requests in {len(convs)} conversations '
          '(measured from the trace; share of the label\'s entropy recovered out of sample, '
          'table / logistic regression)\n')
    print('| features | ' + ' | '.join(f'tau = {t} s' for t in TAUS) + ' |')
    print('|---|' + '---:|' * len(TAUS))
    labels = {t: [1 if g is None or g > t else 0 for _, _, g in rows] for t in TAUS}
    head = []
    for t in TAUS:
        p = sum(labels[t]) / len(rows)
        head.append(f'P(late) {p:.3f}, H {entropy(p):.3f} bits')
    print('| (label) | ' + ' | '.join(head) + ' |')
    for name, keys in SETS:
        cells = []
        for t in TAUS:
            p = sum(labels[t]) / len(rows)
            h = entropy(p)
            a = table_loss(rows, labels[t], fold, keys, p)
            b = logistic_loss(rows, labels[t], fold, keys, t)
            if h == 0:  # every label alike: nothing to recover
                cells.append('–')
                continue
            cells.append(f'{round(100 * (h - a) / h) + 0}% / {round(100 * (h - b) / h) + 0}%')
        print(f'| {name} | ' + ' | '.join(cells) + ' |')
    print('\nfields: ' + '; '.join(f'{k}: {v}' for k, v in FIELDS.items()))


if __name__ == '__main__':
    main()
