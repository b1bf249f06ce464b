#!/usr/bin/env python3
"""Sum a heaptrack_print report by the first frames in this repository.

heaptrack's own report groups by allocation site, which in Rust is mostly
`alloc::alloc` and `Vec::with_capacity`; what a change can act on is the
first caller in src/, fakes/, drivers/ or bench/. Feed it a report printed
with full backtraces, e.g. what a run holds at a phase (see src/phases.rs):

    DRIVELAB_PHASES=1 DRIVELAB_PHASES_EXIT="final convergence" \\
        heaptrack -o /tmp/ht drivelab-bench child growth 10000
    heaptrack_print -f /tmp/ht.zst -p 0 -a 0 -T 0 -l 1 -n 400 -s 100000 > leaks.txt
    scripts/heaptrack-by-frame.py leaks.txt [--depth 3]

(`-p 1 -l 0` instead for the peak's consumers.) The bench binary needs
`--features system-alloc` for heaptrack to see its allocations.
"""
import argparse
import collections
import re

# A call path under an allocation site (its line ends "from:"); the site's
# own total above its paths ("from", no colon) would count each byte twice.
BLOCK = re.compile(r"^\s*([\d.]+)([BKMG]?) (?:consumed|leaked) over \d+ calls from:$")
OURS = re.compile(r"(src|fakes|drivers|bench)/")
UNIT = {"": 1, "B": 1, "K": 1e3, "M": 1e6, "G": 1e9}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report")
    ap.add_argument("--depth", type=int, default=1, help="in-repo frames to group by")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()

    totals = collections.Counter()
    size, frames, function = None, [], None

    def close():
        if size is not None:
            totals[" <- ".join(frames) or "(no frame in this repository)"] += size

    with open(args.report, errors="replace") as f:
        for line in f:
            m = BLOCK.match(line)
            if m:
                close()
                size, frames, function = float(m.group(1)) * UNIT[m.group(2)], [], None
                continue
            if size is None:
                continue
            s = line.strip()
            if s.startswith("at "):
                where = s[3:]
                if OURS.match(where) and len(frames) < args.depth:
                    frames.append(f"{function} {where}")
            elif s and not s.startswith("in "):
                function = s
    close()
    for key, total in totals.most_common(args.top):
        print(f"{total / 1e6:9.2f} MB  {key}")


if __name__ == "__main__":
    main()
