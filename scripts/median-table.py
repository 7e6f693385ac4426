#!/usr/bin/env python3
"""Medians of two builds side by side, for the before/after benchmark scripts.

Reads lines `LABEL<TAB>SIDE<TAB>VALUE` (SIDE: before or after; VALUE: a number, or anything
else for a failed run) from the file named, and prints one row per label: the median of each
side, their ratio (after / before) and how many runs failed on each side.
Usage: median-table.py FILE UNIT
"""
import statistics
import sys


def main(path, unit):
    rows = {}
    for line in open(path):
        label, side, value = (line.rstrip("\n").split("\t") + ["", ""])[:3]
        rows.setdefault(label, {}).setdefault(side, []).append(value)
    width = max([len(k) for k in rows] + [10]) + 2
    print(f"{'':<{width}}{'before ' + unit:>14}{'after ' + unit:>14}{'ratio':>8}{'failed b/a':>12}")
    for label, sides in rows.items():
        med, bad = {}, {}
        for side in ("before", "after"):
            values = sides.get(side, [])
            ok = []
            for v in values:
                try:
                    ok.append(float(v))
                except ValueError:
                    pass
            bad[side] = len(values) - len(ok)
            med[side] = statistics.median(ok) if ok else float("nan")
        ratio = med["after"] / med["before"] if med["before"] else float("nan")
        print(f"{label:<{width}}{med['before']:>14.3f}{med['after']:>14.3f}{ratio:>8.3f}"
              f"{bad['before']:>8}/{bad['after']}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
