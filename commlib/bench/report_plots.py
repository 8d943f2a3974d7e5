"""The report's plots (matplotlib, Agg): busbw and latency vs size per algorithm with peers and
memcpy overlaid, and measured times against the fitted model; one panel per collective."""
from __future__ import annotations

from commlib.perf import common as C
from commlib.perf import model as M
from commlib.bench.comparison import index_by_series, median_us


PEER_STYLE = {"gloo": dict(color="tab:red", ls="--", marker="s"),
              "mpi": dict(color="tab:purple", ls="--", marker="D")}


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _panels(n):
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    return rows, cols


def _grid(plt, keys, title):
    rows, cols = _panels(len(keys))
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.9 * rows), squeeze=False)
    fig.suptitle(title, fontsize=12)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    return fig, list(axes.flat)


def _layout(fig):
    rows = len(fig.axes) and round(fig.get_figheight() / 3.9)
    fig.subplots_adjust(left=0.06, right=0.985, bottom=0.08 if rows > 1 else 0.14, top=0.92 if rows > 1 else 0.86,
                        wspace=0.25, hspace=0.35)


def _size_axis(ax):
    from matplotlib.ticker import FuncFormatter, LogLocator
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=4))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: C.fmt_short(v)))
    ax.set_xlabel("size (bytes)")


def _series_style(name, i):
    if name in PEER_STYLE:
        return dict(PEER_STYLE[name], lw=1.8, ms=4)
    if name == "auto":
        return dict(color="black", lw=2.4, ls="-", marker="", alpha=0.55)
    cmap = pyplot().get_cmap("tab10")
    return dict(color=cmap(i % 10), lw=1.3, ls="-", marker="o", ms=3)


def plot_metric(records, memcpy, P, metric, path):
    """busbw or latency vs size, one panel per collective, for world size P."""
    plt = pyplot()
    idx = {k: v for k, v in index_by_series(records).items() if k[1] == P}
    colls = [c for c in C.COLLECTIVES if (c, P) in idx]
    if not colls:
        return None
    label = "bus bandwidth (GB/s)" if metric == "busbw" else "time (µs, median)"
    fig, axes = _grid(plt, colls, f"{'Bus bandwidth' if metric == 'busbw' else 'Latency'} vs size — "
                                  f"{P} ranks (commlib algorithms, auto, peers)")
    for ax, coll in zip(axes, colls):
        series = idx[(coll, P)]
        names = sorted(series, key=lambda s: (s in ("auto", "gloo", "mpi"), s))
        for i, name in enumerate(names):
            pts = sorted(series[name].items())
            xs = [b for b, _ in pts]
            ys = [r["busbw_GBps"] if metric == "busbw" else median_us(r) for _, r in pts]
            ax.plot(xs, ys, label=name, **_series_style(name, i))
        if metric == "busbw" and memcpy:
            ax.plot([m["bytes"] for m in memcpy], [m["GBps"] for m in memcpy], color="gray", ls=":",
                    lw=1.5, label="memcpy (1 thread)")
        _size_axis(ax)
        ax.set_yscale("log")
        ax.set_title(f"{coll} ({'in-place' if C.COMPARE_MODE[coll] == 'in' else 'out-of-place'})", fontsize=10)
        ax.set_ylabel(label)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    _layout(fig)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def plot_model(records, fits, P, path):
    """Measured (markers) vs fitted model (lines), per collective, commlib algorithms and peers."""
    plt = pyplot()
    idx = {k: v for k, v in index_by_series(records).items() if k[1] == P}
    colls = [c for c in C.COLLECTIVES if (c, P) in idx]
    if not colls:
        return None
    fig, axes = _grid(plt, colls, f"Measured (markers) vs alpha-beta-gamma model (lines) — {P} ranks")
    for ax, coll in zip(axes, colls):
        series = idx[(coll, P)]
        names = sorted((s for s in series if s != "auto"), key=lambda s: (s in ("gloo", "mpi"), s))
        for i, name in enumerate(names):
            pts = sorted(series[name].items())
            rec0 = pts[0][1]
            fit = fits.get(f"{rec0['backend']}/{rec0['transport']}/{P}")
            st = _series_style(name, i)
            xs = [b for b, _ in pts]
            ax.plot(xs, [median_us(r) for _, r in pts], ls="", marker=st.get("marker") or "o", ms=4,
                    color=st["color"], label=name)
            if fit and fit.get("n"):
                alg = M.model_algorithm(rec0)
                ax.plot(xs, [M.predict(fit, coll, alg, b, P) * 1e6 for b in xs], ls="-" if name not in
                        PEER_STYLE else "--", lw=1.1, color=st["color"])
        _size_axis(ax)
        ax.set_yscale("log")
        ax.set_title(coll, fontsize=10)
        ax.set_ylabel("time (µs)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    _layout(fig)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
