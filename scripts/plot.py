#!/usr/bin/env python3
"""Plots of the examples' --json output (PNG).

Needs python3 and matplotlib (Agg backend, no display). Neither CI nor the cargo build uses this
script; install matplotlib only where you make plots (without it, --help and argument errors
still work, and a plot ends with one line saying what to install):
    pip install --break-system-packages matplotlib     # or: apt-get install python3-matplotlib

Usage:
    python3 scripts/plot.py latency   FILE... -o docs/img/latency.png   --machine "H200, soft device"
    python3 scripts/plot.py stencil   FILE... -o docs/img/stencil.png   --machine "..."
    python3 scripts/plot.py bandwidth FILE... -o docs/img/bandwidth.png --machine "..."

Inputs are JSON-lines files; lines that do not start with '{' (comments) are skipped, except
'# FAILED: --flag value ...' lines the benchmark scripts write for a run that failed: those are
listed under the plot as not plotted. What each kind reads:
  latency    pingpong --json (also with --raw, and bench-mp.sh's "api"/"rep" fields) and
             benches/mpi_pingpong.c --json ("impl":"openmpi"): half round trip vs message
             size, one line per trigger / api / mem / raw, one panel per op; log-log.
             --stat picks the statistic (the field t_<STAT>_us; default p50).
  stencil    stencil2d --json: time per iteration vs subdomain edge, one line per trigger
             and rank count; log-log.
  bandwidth  bandwidth --json: GB/s (top) and million messages/s (bottom) vs message size,
             one line per trigger and memory, one column per op; log-log. Lines that coincide
             stay visible: each trigger has its own width and marker positions.
Repeated measurements of one point (several runs, reps) are reduced to their median.
--filter KEY=VALUE (repeatable) keeps only the lines whose field KEY equals VALUE.
--note TEXT (repeatable) adds a footnote, e.g. where a line comes from or why one is short.
"""

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict

# matplotlib, loaded by load_matplotlib() once the command line is read (so that --help and
# argument errors work without it).
plt = FuncFormatter = LogLocator = NullLocator = None


def load_matplotlib():
    """Imports matplotlib (Agg backend, no display), or ends with one line saying what to install."""
    global plt, FuncFormatter, LogLocator, NullLocator
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
        from matplotlib import ticker
    except ImportError as e:
        sys.exit(f"plot.py: needs matplotlib ({e}): pip install matplotlib, or apt-get install python3-matplotlib")
    plt, FuncFormatter, LogLocator = pyplot, ticker.FuncFormatter, ticker.LogLocator
    NullLocator = ticker.NullLocator

TRIGGER_ORDER = ["cpu", "host", "stream", "kernel", "host-stream", "openmpi"]
TRIGGER_COLOR = {
    "cpu": "tab:blue",
    "host": "tab:orange",
    "stream": "tab:green",
    "kernel": "tab:red",
    "host-stream": "tab:olive",
    "openmpi": "black",
}
OP_ORDER = ["write", "write-imm", "read", "send"]


def parse_flags(text):
    """{flag: value} from a command line's '--flag value' pairs; a bare '--flag' is 'true'."""
    words, flags = text.split(), {}
    for i, w in enumerate(words):
        if w.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else None
            flags[w[2:]] = nxt if nxt is not None and not nxt.startswith("--") else "true"
    return flags


def read_rows(paths, filters):
    """The JSON lines of the files that pass the filters, and the runs the benchmark scripts
    marked '# FAILED: --flag value ...' that the filters do not exclude (shown as missing)."""
    rows, failed = [], []
    for path in paths:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if line.startswith("#") and "FAILED:" in line:
                    cmd = line.split("FAILED:", 1)[1].strip()
                    flags = parse_flags(cmd)
                    if all(flags.get(k, v).lower() == v.lower() for k, v in filters):
                        failed.append(cmd)
                    continue
                if not line.startswith("{"):
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"{path}:{n}: not JSON: {e}")
                if all(str(row.get(k)).lower() == v.lower() for k, v in filters):
                    rows.append(row)
    return rows, failed


def human_bytes(x, _pos=None):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if x >= scale:
            v = x / scale
            return f"{v:g} {unit}"
    return f"{x:g} B"


def size_axis(ax, label="message size"):
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=40))
    ax.xaxis.set_major_formatter(FuncFormatter(human_bytes))
    ax.set_xlabel(f"{label} (bytes, log scale)")
    ax.tick_params(axis="x", labelrotation=45)


def log_y(ax, label):
    """A log y axis labelled in plain numbers (400, not 4 × 10²); on axes spanning three
    decades or less, the 2 and 5 of each decade are labelled too."""
    ax.set_yscale("log")
    ax.set_ylabel(label)
    plain = FuncFormatter(lambda y, _p: f"{y:g}")

    def minor(y, _p):
        lo, hi = ax.get_ylim()
        mantissa = round(y / 10 ** math.floor(math.log10(y)), 6)
        return f"{y:g}" if hi / lo <= 1000 and mantissa in (2, 5) else ""

    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(FuncFormatter(minor))


def thin_ticks(ax, values):
    """Byte ticks at the sizes present, at most ~12 of them (every 2nd or 4th power of 2)."""
    vals = sorted(set(values))
    step = max(1, (len(vals) + 11) // 12)
    ax.set_xticks(vals[::step])
    ax.xaxis.set_minor_locator(NullLocator())


def median_points(rows, key_fn, x_fn, y_fn):
    """{series key: [(x, median y)]}, x sorted."""
    acc = defaultdict(lambda: defaultdict(list))
    for r in rows:
        y = y_fn(r)
        if y is None or y <= 0:
            continue
        acc[key_fn(r)][x_fn(r)].append(y)
    return {k: sorted((x, statistics.median(ys)) for x, ys in pts.items()) for k, pts in acc.items()}


def varying(keys, names):
    """The positions in the key tuples whose values differ between series."""
    return [i for i in range(len(names)) if len({k[i] for k in keys}) > 1]


class Styler:
    """Line styles, one per series label across all panels of a figure: the wanted colour,
    line style and marker; when another series already looks like that, another line style
    first (dotted, dashed, ...), then another marker."""

    LINESTYLES = ["-", ":", "--", "-."]
    MARKERS = ["o", "s", "^", "v", "D", "x", "*", "P"]

    def __init__(self):
        self.used = set()
        self.by_label = {}

    def __call__(self, label, color, linestyle, marker):
        if label in self.by_label:
            return self.by_label[label]
        styles = [linestyle] + [ls for ls in self.LINESTYLES if ls != linestyle]
        chosen = dict(color=color, linestyle=linestyle, marker=marker)
        for m in [marker] + self.MARKERS:
            free = [ls for ls in styles if (color, ls, m) not in self.used]
            if free:
                chosen = dict(color=color, linestyle=free[0], marker=m)
                break
        self.used.add((chosen["color"], chosen["linestyle"], chosen["marker"]))
        self.by_label[label] = chosen
        return chosen


def finish(fig, axes, title, args, legend_order=None, ncol=3):
    """Title with the machine, grids, one legend (a lone panel's inside it when short, beside it
    when long; several panels' below them), footnotes below everything (--note, and the runs the
    data marks as failed), and the PNG."""
    fig.suptitle(f"{title}\n{args.machine}", fontsize=13)
    handles = {}
    for ax in axes:
        ax.grid(True, which="major", alpha=0.4)
        ax.grid(True, which="minor", alpha=0.15)
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    if legend_order:
        handles = {k: handles[k] for k in legend_order if k in handles}
    fig.tight_layout()
    artists = list(axes)
    if len(axes) == 1 and len(handles) <= 6:
        axes[0].legend(fontsize=9, handlelength=3.5, loc="best")
    elif len(axes) == 1:  # a long legend would cover lines: beside the panel
        artists.append(axes[0].legend(fontsize=9, handlelength=3.5, loc="upper left",
                                      bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0))
    else:
        artists.append(fig.legend(list(handles.values()), list(handles.keys()), loc="upper center",
                                  bbox_to_anchor=(0.5, 0.0), ncol=min(ncol, len(handles)),
                                  fontsize=11, handlelength=4.5, markerscale=1.4))
    notes = [f"not plotted, the run failed: {cmd}" for cmd in args.failed] + list(args.note)
    if notes:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        inv = fig.transFigure.inverted()
        bottom = min(inv.transform(a.get_tightbbox(renderer))[0][1] for a in artists)
        line = 9 * 1.5 / 72 / fig.get_figheight()  # 9-point lines, in figure heights
        for i, note in enumerate(notes):
            fig.text(0.0, bottom - line * (i + 0.5), note, ha="left", va="top", fontsize=9,
                     style="italic")
    fig.savefig(args.output, dpi=130, bbox_inches="tight")
    print(f"wrote {args.output}")


def panels(n_cols, n_rows=1, width=6.4, height=4.8):
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(width * n_cols, height * n_rows), squeeze=False)
    return fig, axes


# ---------------------------------------------------------------------------- latency

def stat_field(rows, stat):
    """The JSON field of a latency statistic: t_<stat>_us (p99.9 may be spelled p99_9)."""
    names = [f"t_{stat}_us", f"t_{stat.replace('.', '_')}_us", f"t_{stat.replace('.', '')}_us"]
    for name in names:
        if any(name in r for r in rows):
            return name
    have = sorted({k[2:-3] for r in rows for k in r if k.startswith("t_") and k.endswith("_us")})
    sys.exit(f"latency: no field {names[0]} in the input (statistics there: {', '.join(have) or 'none'})")


def latency(rows, args):
    stat = stat_field(rows, args.stat)
    names = ["trigger", "api", "mem", "raw", "ranks"]
    rows = [r for r in rows if stat in r and "bytes" in r and ("trigger" in r or r.get("impl") == "openmpi")]

    def key(r):
        if r.get("impl") == "openmpi":
            return ("openmpi", "Open MPI", r.get("mem", "host"), False, "procs")
        # pingpong reports how ranks run in ranks_as (older output: ranks "threads-mp").
        ranks = r.get("ranks_as") or str(r.get("ranks", "threads")).removesuffix("-mp")
        return (r["trigger"], r.get("api", "gdsync"), r.get("mem", "host"), bool(r.get("raw")), ranks)

    def label(k, show):
        trig, api, mem, raw, ranks = k
        if trig == "openmpi":
            return f"Open MPI, {mem} mem" + (" (staged through host)" if mem == "device" else "")
        parts = [trig]
        if "api" in show:
            parts.append(f"api {api}")
        if "mem" in show:
            parts.append(f"{mem} mem")
        if raw:
            parts.append("--raw floor")
        if "ranks" in show:
            parts.append(f"ranks: {ranks}")
        return ", ".join(parts)

    ops = sorted({r.get("op", "send") for r in rows}, key=lambda o: OP_ORDER.index(o) if o in OP_ORDER else 99)
    if not ops:
        sys.exit("latency: no pingpong or mpi_pingpong JSON lines in the input")
    fig, axes = panels(len(ops))
    style = Styler()
    # What tells this file's gdsync series apart (Open MPI is labelled on its own).
    show = {names[i] for i in varying([key(r) for r in rows if r.get("impl") != "openmpi"] or [("", "", "", False, "")], names)}
    for ax, op in zip(axes[0], ops):
        sel = [r for r in rows if r.get("op", "send") == op]
        series = median_points(sel, key, lambda r: r["bytes"], lambda r: r.get(stat))
        order = sorted(series, key=lambda k: (TRIGGER_ORDER.index(k[0]) if k[0] in TRIGGER_ORDER else 99,) + k[1:])
        for k in order:
            trig, api, mem, raw, _ranks = k
            xs, ys = zip(*series[k])
            ls = "--" if raw else ("-." if mem == "device" else "-")
            marker = "^" if api == "mp" else ("s" if mem == "device" else "o")
            name = label(k, show)
            ax.plot(xs, ys, ms=4, label=name, **style(name, TRIGGER_COLOR.get(trig), ls, marker))
        size_axis(ax)
        thin_ticks(ax, [r["bytes"] for r in sel])
        log_y(ax, f"half round trip, {args.stat} (µs, log scale)")
        ax.set_title(f"op: {op}")
    finish(fig, axes[0], "pingpong: half round-trip latency vs message size", args)


# ---------------------------------------------------------------------------- stencil

def edge(r):
    a, b = (int(v) for v in r["subdomain"].split("x"))
    return a if a == b else round((a * b) ** 0.5)


def stencil(rows, args):
    rows = [r for r in rows if "us_per_iter" in r and "subdomain" in r]
    if not rows:
        sys.exit("stencil: no stencil2d JSON lines in the input")
    key = lambda r: (r["trigger"], r["ranks"], r.get("ranks_as", "threads"))  # noqa: E731
    series = median_points(rows, key, edge, lambda r: r["us_per_iter"])
    show_ranks_as = len({k[2] for k in series}) > 1
    fig, axes = panels(1)
    ax = axes[0][0]
    rank_styles = {}
    style = Styler()
    for k in sorted(series, key=lambda k: (k[1], TRIGGER_ORDER.index(k[0]) if k[0] in TRIGGER_ORDER else 99, k[2])):
        trig, ranks, ranks_as = k
        xs, ys = zip(*series[k])
        ls = rank_styles.setdefault(ranks, ["-", "--", ":", "-."][len(rank_styles) % 4])
        label = f"{trig}, {ranks} rank{'s' if ranks != 1 else ''}" + (f" ({ranks_as})" if show_ranks_as else "")
        ax.plot(xs, ys, ms=4, label=label, **style(label, TRIGGER_COLOR.get(trig), ls, "o"))
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({x for pts in series.values() for x, _ in pts}))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _p: f"{x:g}²"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("subdomain per rank (edge² cells, log scale)")
    log_y(ax, "time per iteration (µs, log scale)")
    finish(fig, [ax], "stencil2d: time per Jacobi iteration vs subdomain", args)


# ---------------------------------------------------------------------------- bandwidth

# Bandwidth lines often coincide (stream and kernel post the same chunks): each trigger gets its
# own width, drawn widest first, and its markers at other sizes, so coinciding lines stay visible.
BW_TRIGGER_STYLE = {
    "cpu": dict(lw=5.0, marker="o", ms=7, every=(0, 3)),
    "stream": dict(lw=3.0, marker="s", ms=6, every=(1, 3)),
    "kernel": dict(lw=1.3, marker="^", ms=6, every=(2, 3)),
    "host-stream": dict(lw=1.0, marker="x", ms=6, every=(0, 3)),
}
# The JSON field of the bandwidth, by the names the example has used.
GBPS_FIELDS = ["gbps", "gb_per_s", "gbytes_per_s"]


def bandwidth(rows, args):
    def size(r):
        return r.get("size", r.get("bytes"))

    def gbps(r):
        return next((r[k] for k in GBPS_FIELDS if k in r), None)

    rows = [r for r in rows if size(r) is not None and gbps(r) is not None]
    if not rows:
        sys.exit(f"bandwidth: no bandwidth JSON lines (with one of {', '.join(GBPS_FIELDS)}) in the input")
    ops = sorted({r["op"].lower() for r in rows}, key=lambda o: OP_ORDER.index(o) if o in OP_ORDER else 99)
    key = lambda r: (r["trigger"], r.get("mem", "host"), r.get("window", 64))  # noqa: E731
    show_window = len({key(r)[2] for r in rows}) > 1
    fig, axes = panels(len(ops), 2, width=5.2, height=4.2)
    metrics = [
        (gbps, "bandwidth (GB/s = 10⁹ B/s, log scale)"),
        (lambda r: r.get("mmsgs", r.get("mmsg_per_s")), "message rate (million messages/s, log scale)"),
    ]

    def order(k):
        return (TRIGGER_ORDER.index(k[0]) if k[0] in TRIGGER_ORDER else 99, k[1] != "host", k[2])

    labels = []
    for col, op in enumerate(ops):
        sel = [r for r in rows if r["op"].lower() == op]
        for row, (metric, ylabel) in enumerate(metrics):
            ax = axes[row][col]
            series = median_points(sel, key, size, metric)
            for k in sorted(series, key=order):
                trig, mem, window = k
                xs, ys = zip(*series[k])
                label = f"{trig}, {mem} memory" + (f", window {window}" if show_window else "")
                if label not in labels:
                    labels.append(label)
                st = BW_TRIGGER_STYLE.get(trig, dict(lw=1.0, marker="D", ms=5, every=(0, 3)))
                color = TRIGGER_COLOR.get(trig)
                ax.plot(xs, ys, label=label, color=color, lw=st["lw"],
                        linestyle=(0, (4, 2)) if mem == "device" else "-",
                        marker=st["marker"], ms=st["ms"], markevery=st["every"],
                        markerfacecolor="white" if mem == "device" else color,
                        markeredgecolor=color, markeredgewidth=1.5)
            size_axis(ax)
            thin_ticks(ax, [size(r) for r in sel])
            log_y(ax, ylabel)
            ax.set_title(f"op: {op}")
    # Legend columns: one per trigger (host memory above device memory).
    labels.sort(key=lambda lab: next((i for i, t in enumerate(TRIGGER_ORDER) if lab.startswith(t + ",")), 99))
    ncol = len({lab.split(",")[0] for lab in labels})
    finish(fig, [a for row in axes for a in row], "bandwidth: one-way RDMA throughput vs message size",
           args, legend_order=labels, ncol=ncol)


def main():
    p = argparse.ArgumentParser(description="PNG plots of the examples' --json output (needs matplotlib).")
    p.add_argument("kind", choices=["latency", "stencil", "bandwidth"])
    p.add_argument("files", nargs="+", help="JSON-lines files")
    p.add_argument("-o", "--output", required=True, help="the PNG to write")
    p.add_argument("--machine", required=True, help="machine name shown under the title, e.g. 'H200, soft device'")
    p.add_argument("--stat", default="p50",
                   help="latency statistic: the field t_<STAT>_us (min, p50, avg, p99, ...; default p50)")
    p.add_argument("--note", action="append", default=[], metavar="TEXT",
                   help="a footnote under the plot, e.g. where a line comes from (repeatable)")
    p.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE",
                   help="keep only lines whose field KEY equals VALUE (repeatable)")
    args = p.parse_args()
    filters = []
    for f in args.filter:
        if "=" not in f:
            p.error(f"--filter {f!r}: expected KEY=VALUE")
        filters.append(tuple(f.split("=", 1)))
    load_matplotlib()
    rows, args.failed = read_rows(args.files, filters)
    {"latency": latency, "stencil": stencil, "bandwidth": bandwidth}[args.kind](rows, args)


if __name__ == "__main__":
    main()
