"""The recurrent family (`lstm`, `gru`) on the DSP cluster: one fused, persistent cell per core.

    relayout W -> W^T (i, G h), R -> R^T (h, G h) in DDR, by the cores (once; G = 4 or 3 gates)
    FOR core g of the grid (batch group g // hsplit, hidden group g % hsplit)         [opc.dsp.cores]
      init   biases Wb + Rb of the core's gate columns -> AM; c0 -> AM (lstm); h0 -> AM (gru);
             the resident K chunks of W^T / R^T -> AM; the streamed ones -> GSM (w_path=gsm)
      FOR step s (input position s, or t-1-s with reverse=1)                           [opc.dsp.stage]
        x    per K chunk of x_pos: its rows DDR -> SM (the products' broadcast scalars), the
             W^T chunk resident in AM or streamed (GSM / DDR -> AM), gates += x W^T on the VPEs
        h    per K chunk of h_{s-1}: GSM (h0: DDR) -> SM, gates += h R^T
        rh   (gru, lbr=0) r = sigmoid(.), r * h_{s-1} -> GSM (barrier), then
        g    per K chunk of r * h: GSM -> SM, gates_hn += (r h) R_n^T
        cell sigmoid / tanh of the gates, c (AM-resident) and h on the vector unit
        out  h -> Y[pos] (DDR) and -> GSM (the next step's scalars; a barrier when the hidden
             units are split: every core needs the whole h_{s-1})

The gate columns of a core's hidden units are on the 32 lanes (each gate a block of the units
padded to a multiple of 32; gru keeps x Wn^T and h Rn^T apart: blocks xn, z, r, hn), so the
per-step product h_{t-1} R^T is the GEMM micro-kernel of the other dsp kernels: A (h or x rows)
as SM scalars broadcast to the lanes, B (W^T / R^T rows) as AM vectors, the gates accumulating in
AM from the biases. The gates never leave AM; c stays in AM over the whole sequence. Cores split
the hidden units (`hsplit` groups: each core keeps only its units' weight columns on chip, the
h exchange goes through GSM with one barrier a step) and / or the batch rows (no exchange: each
core reads its own rows of h back). K chunks (`kc` rows) are resident in AM in order while they
fit; the rest stream per step from GSM (`w_path=gsm`, loaded once) or DDR, double-buffered with
`dbuf` (the next chunk's copies issued before this chunk's product). fp32 only.

The kernel is a TIR loop nest of stage events (as `attention.py`'s); the backend's lowering
"recurrent" (`opcompiler/backend/dsp/lower/recurrent.py`) turns each into DMA descriptors and
vector instructions. `plan` states the layout both sides read (plain data in `params`).
"""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.dsp.intrin import ALIGN, CORES, EVENT, F32, STAGE, machine
from opcompiler.ops import get_op
from opcompiler.target import Target
from opcompiler.template_base import Knob, Scheduled, Template, register_template
from opcompiler.workload import Workload

from .common import capacity_why, refuse_invalid, require_fp32
from .stream import cdiv, cores_knob

KC = (16, 32, 64, 128, 256)  # K rows per chunk (the SM stage of the A scalars)
HSPLIT = (1, 2, 4, 8)  # hidden-unit groups of the core grid


def gate_layout(op: str, lbr: int) -> dict[str, Any]:
    """The gate blocks in AM and what accumulates into them. `kinds`: (name, weight in DDR
    (relaid W^T / R^T), gate indices of its columns in block order, first block, A source, K
    axis); `bias`: per block the B offsets (in units of h) summed into it; `G`: gates in W / R."""
    if op == "lstm":  # blocks i, o, f, c (ONNX order); x and h products both into all four
        return {"G": 4, "blocks": 4, "names": ("i", "o", "f", "c"),
                "kinds": (("x", "WT", (0, 1, 2, 3), 0, "x", "i"), ("h", "RT", (0, 1, 2, 3), 0, "h", "h")),
                "bias": ((0, 4), (1, 5), (2, 6), (3, 7))}
    if op == "gru":  # blocks xn, z, r, hn: the x product into (xn, z, r), the h product into (z, r, hn)
        kinds = [("x", "WT", (2, 0, 1), 0, "x", "i")]
        if lbr:
            kinds.append(("h", "RT", (0, 1, 2), 1, "h", "h"))
        else:  # n's hidden product takes r * h: a second exchange
            kinds += [("h", "RT", (0, 1), 1, "h", "h"), ("g", "RT", (2,), 3, "rh", "h")]
        return {"G": 3, "blocks": 4, "names": ("xn", "z", "r", "hn"), "kinds": tuple(kinds),
                "bias": ((2,), (0, 3), (1, 4), (5,))}
    raise ValueError(f"no dsp recurrent layout for {op}")


def grid(wl: Workload, cfg: Mapping[str, Any], cores: int) -> list[tuple[int, int, int, int]]:
    """(n0, n1, u0, u1) of each core: batch group g // hsplit, hidden group g % hsplit, balanced."""
    b, h, ch = wl["b"], wl["h"], int(cfg["hsplit"])
    cb = max(1, cores // ch)
    return [((g // ch) * b // cb, (g // ch + 1) * b // cb, (g % ch) * h // ch, (g % ch + 1) * h // ch)
            for g in range(cb * ch)]


def _align(top: int, level: str) -> int:
    return cdiv(top, ALIGN[level]) * ALIGN[level]


def plan(wl: Workload, cfg: Mapping[str, Any], m) -> dict[str, Any]:
    """Everything the lowering allocates and loops over (plain data): the core grid, the K chunks
    (kind, k0, rows, resident), the buffers in allocation order per level."""
    op, lbr = wl.op, int(wl.p.get("lbr", 1))
    lay = gate_layout(op, lbr)
    cores = max(1, min(int(cfg["cores"]), m.cores))
    kc, slots, L = int(cfg["kc"]), 2 if cfg["dbuf"] else 1, m.lanes
    g = grid(wl, cfg, cores)
    nb = max(n1 - n0 for n0, n1, _, _ in g)
    hcp = max(cdiv(u1 - u0, L) * L for _, _, u0, u1 in g)
    nblk = lay["blocks"]
    kinds = lay["kinds"]
    ncols = [len(k[2]) * hcp for k in kinds]
    chunks = [(ki, k0, min(kc, wl[k[5]] - k0)) for ki, k in enumerate(kinds) for k0 in range(0, wl[k[5]], kc)]
    am = [("AM", "gates", nb * nblk * hcp * F32), ("AM", "bias", nblk * hcp * F32),
          ("AM", "bias_w", nblk * hcp * F32), ("AM", "bias_r", nblk * hcp * F32)]
    if op == "lstm":
        am.append(("AM", "c", nb * hcp * F32))
    am += [("AM", f"h_{s}", nb * hcp * F32) for s in range(2)]
    if any(k[4] == "rh" for k in kinds):
        am.append(("AM", "rh", nb * hcp * F32))

    def top(bufs) -> int:
        t = 0
        for _, _, n in bufs:
            t = _align(t, "AM") + n
        return t
    cap = m.cap("AM")
    res_bufs = [("AM", f"w_{j}", kn * ncols[ki] * F32) for j, (ki, _, kn) in enumerate(chunks)]
    if top(am + res_bufs) <= cap:  # every chunk resident
        resident = [True] * len(chunks)
        am += res_bufs
    else:  # the stream slots first, then chunks in order while they fit
        am += [("AM", f"wstream_{s}", kc * max(ncols) * F32) for s in range(slots)]
        resident = []
        for buf in res_bufs:
            ok = top(am + [buf]) <= cap and all(resident)
            resident.append(ok)
            if ok:
                am.append(buf)
    sm = [("SM", f"a_{s}", nb * kc * F32) for s in range(slots)]
    gsm = [("GSM", f"hG_{s}", wl["b"] * wl["h"] * F32) for s in range(2)]
    if any(k[4] == "rh" for k in kinds):
        gsm.append(("GSM", "rhG", wl["b"] * wl["h"] * F32))
    streamed = [j for j, r in enumerate(resident) if not r]
    if streamed and cfg["w_path"] == "gsm":  # one region per hidden group, each group's own columns
        for q in range(int(cfg["hsplit"])):
            u0, u1 = q * wl["h"] // int(cfg["hsplit"]), (q + 1) * wl["h"] // int(cfg["hsplit"])
            hq = cdiv(u1 - u0, L) * L
            for j in streamed:
                ki, _, kn = chunks[j]
                gsm.append(("GSM", f"wG_{q}_{j}", kn * len(kinds[ki][2]) * hq * F32))
    return {"grid": g, "nb": nb, "hcp": hcp, "chunks": [(ki, k0, kn, r) for (ki, k0, kn), r in zip(chunks, resident)],
            "kinds": kinds, "layout": lay, "buffers": am + sm + gsm, "cores": cores, "slots": slots, "kc": kc,
            "streamed": len(streamed)}


def footprint(wl: Workload, cfg: Mapping[str, Any], m) -> dict[str, int]:
    """The bytes each level's buffers reach, placed in order at the level's alignment."""
    out = {"AM": 0, "SM": 0, "GSM": 0}
    for level, _, n in plan(wl, cfg, m)["buffers"]:
        out[level] = _align(out[level], level) + n
    return out


def kernel(cores: int, t: int, reverse: bool, nchunks: tuple[int, ...], kinds: tuple[str, ...]):
    """The persistent-cell loop nest: a PrimFunc of stage events (see the module docstring)."""
    import tvm
    from tvm import tirx

    g, s = tirx.Var("g", "int32"), tirx.Var("s", "int32")
    pos = (t - 1 - s) if reverse else s

    def ev(tag: str, *args) -> Any:
        return tirx.Evaluate(tirx.call_packed(EVENT, tag, g, pos, *args))

    body = []
    for kind, n in zip(kinds, nchunks):
        if kind == "g":
            body.append(ev("rh"))
        j = tirx.Var(f"j_{kind}", "int32")
        body.append(tirx.For(j, 0, n, tirx.ForKind.SERIAL, ev(kind, j)))
    body += [ev("cell"), ev("out")]
    steps = tirx.For(s, 0, t, tirx.ForKind.SERIAL, tirx.SeqStmt(body), annotations={STAGE: 1})
    top = tirx.For(g, 0, cores, tirx.ForKind.SERIAL,
                   tirx.SeqStmt([tirx.Evaluate(tirx.call_packed(EVENT, "init", g, -1)), steps]),
                   annotations={CORES: 1})
    func = tirx.PrimFunc([tirx.Var(n, "handle") for n in ("X", "W", "R", "B", "Y")], top).with_attr(
        "global_symbol", "main")
    return tvm.IRModule({"main": func})


STEP_SYNC = 1500  # a step's drain at the barrier in `estimate`: the first copies and the last write-back


def estimate(m, wl: Workload, cfg: Mapping[str, Any]) -> float:
    """A rough cycle estimate of the DSP part (the default's ranking, not the simulator): per step
    the busiest of a core's VPU work (the products at the FMACs' rate, the cell), its DMA engine
    (a start-up per copy, bytes, runs) and the cluster's DDR / GSM bytes, plus the barrier's drain
    when the hidden units are split; plus the resident weights' copies."""
    p = plan(wl, cfg, m)
    L, nb, hcp = m.lanes, p["nb"], p["hcp"]
    hv, kinds, ch = hcp // L, p["kinds"], int(cfg["hsplit"])
    fixed = m.dma_startup + m.ddr_latency
    vpu = dma = ddr = gsm = init = 0.0
    for ki, _, kn, res in p["chunks"]:
        nvec = len(kinds[ki][2]) * hv
        vpu += nb * nvec * kn / m.fmac_units * 1.08 + 2 * nb * nvec / m.ldst_per_cycle + 40
        dma += fixed + nb * kn * F32 / m.dma_bytes_per_cycle + nb * m.dma_row_cycles
        src_bytes = nb * kn * F32 * p["cores"]
        if kinds[ki][4] == "x":
            ddr += src_bytes
        else:
            gsm += src_bytes
        wbytes = kn * nvec * L * F32
        if res:
            init += fixed + wbytes / m.dma_bytes_per_cycle + kn * len(kinds[ki][2]) * m.dma_row_cycles
        elif cfg["w_path"] == "gsm":
            dma += m.dma_startup + m.gsm_latency + wbytes / m.dma_bytes_per_cycle
            gsm += wbytes * p["cores"]
        else:
            dma += len(kinds[ki][2]) * fixed + wbytes / m.dma_bytes_per_cycle + kn * len(kinds[ki][2]) * m.dma_row_cycles
            ddr += wbytes * p["cores"]
    vpu += nb * hv * (110 if wl.op == "lstm" else 90) + nb * 4 * hv
    dma += 2 * (fixed + nb * hcp * F32 / m.dma_bytes_per_cycle)
    step = max(vpu, dma, ddr / m.ddr_bytes_per_cycle / 0.85, gsm / m.gsm_bytes_per_cycle / 0.85)
    if ch > 1:
        step += STEP_SYNC
    return wl["t"] * step + init


@register_template
class DspRecurrent(Template):
    """The fused persistent LSTM / GRU cell: weights resident in AM (or streamed), c in AM, the
    gates on the VPEs, h exchanged through GSM."""

    name = "dsp.recurrent.cell"
    op_families = ("recurrent",)
    target_family = "dsp"
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        require_fp32(wl, target)
        m = machine(target)
        kmax = max(wl["i"], wl["h"])
        kcs = tuple(v for v in KC if v < kmax) + tuple(v for v in KC if v >= kmax)[:1]
        return [
            Knob("hsplit", tuple(v for v in HSPLIT if v <= m.cores and v <= wl["h"]),
                 "core groups over the hidden units (the rest of the cores split the batch rows)"),
            Knob("kc", kcs, "K rows per chunk of the products (the SM stage of x / h, a streamed weight slab)"),
            Knob("w_path", ("gsm", "ddr"), "where the weight chunks that do not fit AM stream from each step"),
            Knob("dbuf", (1, 0), "two SM / stream slots: the next chunk's copies overlap the product"),
            cores_knob(m),
        ]

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        if wl.dtype != "float32":
            return f"the DSP's VPEs compute fp32, not {wl.dtype}"
        m = machine(target)
        cores = max(1, min(int(config["cores"]), m.cores))
        if cores % int(config["hsplit"]):
            return f"hsplit {config['hsplit']} does not divide the {cores} cores"
        return capacity_why(m, footprint(wl, config, m))

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        """Every core taking part, double-buffered; the hidden split, chunk rows and weight path
        with the least `estimate` (splitting the hidden units keeps each core's weight columns
        on chip at the price of a barrier a step; splitting the batch needs every core to see
        all the weights), then the larger chunk."""
        m = machine(target)
        sp = {k.name: k.values for k in self.space(wl, target)}
        best, rank = None, None
        for ch in sp["hsplit"]:
            for kc in sp["kc"]:
                for wp in sp["w_path"]:
                    cfg = {"hsplit": ch, "kc": kc, "w_path": wp, "dbuf": 1, "cores": m.cores}
                    if self.check(wl, target, cfg) is not None:
                        continue
                    r = (estimate(m, wl, cfg), -kc, wp)
                    if rank is None or r < rank:
                        best, rank = cfg, r
        if best is not None:
            return best
        return {"hsplit": sp["hsplit"][0], "kc": sp["kc"][0], "w_path": "ddr", "dbuf": 0, "cores": m.cores}

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        require_fp32(wl, target)
        refuse_invalid(self, wl, target, config)
        m = machine(target)
        p = plan(wl, config, m)
        t, b, i, h = (wl[k] for k in ("t", "b", "i", "h"))
        lay = p["layout"]
        G = lay["G"]
        op = get_op(wl.op)
        inputs = [(nm, tuple(s)) for nm, s, _ in op.inputs(wl)]
        ddr = {nm: s for nm, s in inputs}
        ddr["out"] = (t, b, h)
        ddr["WT"], ddr["RT"] = (i, G * h), (h, G * h)
        # W (1, G h, i) -> W^T (i, G h) and R -> R^T, by the cores before the kernel (element runs)
        pre = (("W", "WT", (i, G * h), (1, i), False), ("R", "RT", (h, G * h), (1, h), False))
        reverse = bool(wl.p.get("reverse", 0))
        kinds = tuple(k[0] for k in p["kinds"])
        nchunks = tuple(sum(1 for c in p["chunks"] if c[0] == ki) for ki in range(len(kinds)))
        busy = [c for c, (n0, n1, u0, u1) in enumerate(p["grid"]) if n1 > n0 and u1 > u0]
        key = ("dsp.recurrent", len(p["grid"]), t, reverse, nchunks, kinds)
        params = {"inputs": tuple(inputs), "ddr": ddr, "out_shape": (t, b, h), "args": {}, "pre": pre,
                  "op": wl.op, "t": t, "b": b, "i": i, "h": h, "reverse": reverse, "G": G,
                  "blocks": lay["blocks"], "kinds": p["kinds"], "bias": lay["bias"], "chunks": tuple(p["chunks"]),
                  "grid": tuple(p["grid"]), "nb": p["nb"], "hcp": p["hcp"], "kc": p["kc"], "slots": p["slots"],
                  "hsplit": int(config["hsplit"]), "w_path": config["w_path"], "dbuf": bool(config["dbuf"]),
                  "cores": len(p["grid"]), "cores_used": len(busy)}
        return Scheduled(
            lowering="recurrent", key=key, module=lambda: kernel(len(p["grid"]), t, reverse, nchunks, kinds),
            params=params, buffers=p["buffers"], flops=op.flops(wl),
            info={"gates_in_ddr_bytes": 0, "weights": f"{sum(c[3] for c in p['chunks'])} of {len(p['chunks'])} "
                  f"K chunks resident in AM, the rest streamed from {config['w_path'].upper()}" if p["streamed"]
                  else "resident in AM", "split": f"{config['hsplit']} hidden group(s) x "
                  f"{len(p['grid']) // int(config['hsplit'])} batch group(s)"})

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        m = machine(target)
        config = self.config(wl, target, config)
        p = plan(wl, config, m)
        fp = footprint(wl, config, m)
        h = wl["h"]
        return {"active_cores": len(p["grid"]), "rows_per_core": p["nb"], "lanes_per_gate": p["hcp"],
                "lane_use": h / (int(config["hsplit"]) * p["hcp"]), "k_chunks": len(p["chunks"]),
                "streamed_chunks": p["streamed"], "am_occupancy": fp["AM"] / m.cap("AM"),
                "sm_occupancy": fp["SM"] / m.cap("SM"), "gsm_occupancy": fp["GSM"] / m.cap("GSM"),
                "estimate": estimate(m, wl, config)}
