"""Reading the WEKA trace for the analysis scripts (weka_next_gap.py, weka_conv_model.py).

One conversation per line; a conversation's main-thread requests are its "n" and "s" entries (a
subagent's nested requests are their own threads and are left out). Pure Python 3.
"""
import gzip
import json
import sys

# what a malformed line raises, from JSON or from a script's own field parsing
MALFORMED = (ValueError, KeyError, TypeError, AttributeError, OverflowError)


def conversations(path, tool, parse, limit=None):
    """[parse(main-thread requests) for each conversation of the trace at path], at most limit
    of them. A file that cannot be opened or read (a corrupt or truncated .gz), or a line that
    JSON or parse rejects with one of MALFORMED, ends the program with a message naming tool,
    the file and the line."""
    out = []
    try:
        f = gzip.open(path, 'rt') if path.endswith('.gz') else open(path)
    except OSError as e:
        sys.exit(f'{tool}: cannot open {path}: {e.strerror}')
    ln = 0
    try:
        with f:
            for ln, line in enumerate(f, 1):
                if limit is not None and len(out) >= limit:
                    break
                try:
                    reqs = [r for r in json.loads(line)['requests'] if r.get('type') in ('n', 's')]
                    out.append(parse(reqs))
                except MALFORMED as e:
                    sys.exit(f'{tool}: {path}:{ln}: not a WEKA conversation ({e!r})')
    except (OSError, EOFError) as e:
        sys.exit(f'{tool}: {path}: unreadable after line {ln} ({e})')
    return out
