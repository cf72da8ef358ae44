"""The per-layer picture of a comparison: for every fused kernel, its cost next to the unfused
kernels that do the same work (stacked by primitive op), in time (or cycles) and off-chip bytes."""
from __future__ import annotations

from pathlib import Path

from ..errors import OpcError
from .compare import Comparison

_COLORS = {"conv2d": "#4C72B0", "matmul": "#4C72B0", "batch_norm": "#DD8452", "bias_add": "#937860",
           "relu": "#55A868", "add": "#C44E52", "pool2d": "#8172B3", "softmax": "#DA8BC3", "concat": "#8C8C8C",
           "host": "#000000"}


def _layers(c: Comparison, plan: str = "fused") -> list[tuple[str, object, list]]:
    """(label, fused kernel, unfused kernels doing its work) in graph order. Unfused kernels go
    under the fused kernel holding their primitive (`Comparison.attribution`), so a Conv node's
    conv2d and bias_add each go where that primitive went; a kernel holding only part of an ONNX
    node says so in its label."""
    run = c.runs[plan]
    kernels = {k.name: k for k in run.kernels}
    unfused = {k.name: k for k in c.unfused.kernels}
    layers = []
    for a in c.attribution(plan):
        k = kernels[a["kernel"]]
        label = "+".join(dict.fromkeys(o.split(":")[0] for o in k.prim_ops))
        if a["partial_nodes"]:
            label += " (part of " + ", ".join(f"{n} with {'/'.join(o)}" for n, o in a["partial_nodes"].items()) + ")"
        layers.append((f"{k.name} {label}", k, [unfused[u] for u in a["unfused"]]))
    return layers


def plot_compare(c: Comparison, path: str | Path) -> Path:
    """Write a PNG with two panels (cost, off-chip bytes): per fused kernel, a fused bar and a
    stacked unfused bar. Returns the path."""
    try:
        import matplotlib
    except ImportError:
        raise OpcError("matplotlib is not installed", arg="--plot", value=str(path),
                       expected="pip install 'opcompiler[plot]'") from None

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    import numpy as np

    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise OpcError("unsupported plot format", arg="--plot", value=str(path), expected="a .png, .svg or .pdf path")
    layers = _layers(c)
    use_cycles = c.summary().get("cycles") is not None
    cost = (lambda k: k.cycles or 0) if use_cycles else (lambda k: k.seconds * 1e6)
    unit = "cycles" if use_cycles else "microseconds"
    x = np.arange(len(layers))
    fig, axes = plt.subplots(2, 1, figsize=(max(8.0, 0.55 * len(layers) + 3), 8.5), sharex=True)
    seen: set[str] = set()
    for ax, metric, ylabel in ((axes[0], cost, f"time ({unit})"),
                               (axes[1], lambda k: k.offchip_bytes / 1e6, "off-chip bytes (MB)")):
        ax.bar(x - 0.2, [metric(f) for _, f, _ in layers], 0.38, color="#2A9D8F", label="fused kernel")
        bottom = np.zeros(len(layers))
        for i, (_, _, parts) in enumerate(layers):
            for k in parts:
                kind = "host" if k.where == "host" else (k.prim_ops[0].split(":")[0] if k.op == "ew_chain" else k.op)
                color = _COLORS.get(kind, "#CCB974")
                lab = f"unfused: {kind}" if kind not in seen else None
                seen.add(kind)
                ax.bar(x[i] + 0.2, metric(k), 0.38, bottom=bottom[i], color=color, label=lab, edgecolor="white",
                       linewidth=0.5)
                bottom[i] += metric(k)
        ax.set_ylim(top=max([metric(f) for _, f, _ in layers] + list(bottom) + [1e-9]) * 1.3)  # room for the legend
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    s = c.summary()
    t = c.fused.plan
    ratio = f"speedup {s['speedup']:.2f}x" if s["speedup"] else ""
    byt = f"off-chip {s['offchip_ratio']:.2f}x less" if s["offchip_ratio"] else ""
    axes[0].set_title(f"{t.graph.name} on {t.target.name} ({t.dtype}, batch {t.graph.batch}): {ratio}, {byt}\n"
                      "per fused kernel: fused (left bar) vs the unfused kernels doing the same work (right, stacked)",
                      fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    h2, l2 = axes[1].get_legend_handles_labels()
    for h, lab in zip(h2, l2):
        if lab not in labels:
            handles.append(h)
            labels.append(lab)
    axes[0].legend(handles, labels, fontsize=8, ncol=3, loc="upper right")
    axes[1].set_xticks(x)
    axes[1].set_xticklabels([lab for lab, _, _ in layers], rotation=45, ha="right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
