"""dsp-sim batch_matmul: the blocked GEMM of the matmul template (`gemm.py`, `algo=gemm`) with the
batch outermost in its C blocks.

The schedule is `gemm_schedule` over the op's own compute: the batch loop fused with the N and M
block loops into the one loop whose iterations the cores take in rounds (`opc.dsp.blocks`), so
the batches' C blocks are spread over the cores together. Each block's tiles are the GEMM's (C in
AM over the reduction, B blocks via GSM or from DDR, A stages in SM, register blocks of `pw` rows
x `kv` vectors); a block reads its own batch's A and B (B shared by every batch with `bcast_b`:
the cores of a round then share its panels in GSM). Transposed operands are relaid by DMA before
the kernel (counted), as matmul's: A (b, k, m) -> (b, m, k) split over the cores by batch, B
(b, n, k) -> (b, k, n) the same way, a shared B (n, k) -> (k, n) by core 0.
"""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.dsp.intrin import machine
from opcompiler.errors import OpcError
from opcompiler.ops import get_op
from opcompiler.target import Target
from opcompiler.template_base import Knob, Scheduled, Template, register_template
from opcompiler.workload import Workload

from .common import refuse_invalid, require_fp32
from .gemm import KC, MB, NB, GemmGeo, check_gemm, gemm_features
from .gemm import scheduled as gemm_scheduled
from .matmul import _upto

FIXED = {"split": "items", "out_path": "ddr"}  # what check_gemm asks of a GEMM config besides its tiles


@register_template
class DspBatchMatmul(Template):
    """C[b] = A[b] @ B[b]: the blocked GEMM over every batch's C blocks."""

    name = "dsp.batch_matmul.gemm"
    op_families = ("batch_matmul",)
    target_family = "dsp"
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        require_fp32(wl, target)
        m_, k_, n_ = wl["m"], wl["k"], wl["n"]
        lanes = machine(target).lanes
        return [
            Knob("pw", tuple(v for v in (1, 2, 3, 4, 6, 8, 12, 16) if v <= m_) or (1,), "C rows per register block"),
            Knob("kv", tuple(range(1, max(1, min(12, -(-n_ // lanes))) + 1)),
                 "vectors of 32 C columns per register block"),
            Knob("rows", tuple(v for v in (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128) if v <= m_) or (1,),
                 "A rows per SM stage"),
            Knob("kc", _upto(KC, k_), "reduction steps per K block"),
            Knob("mb", _upto(MB, m_), "rows of the C block a core keeps in AM"),
            Knob("nb", _upto(NB, -(-n_ // lanes) * lanes), "columns of the C block (and of the B blocks)"),
            Knob("dbuf", (1, 0), "double-buffer the SM / AM tiles"),
            Knob("w_path", ("gsm", "ddr"), "B blocks through GSM (shared by the round's cores) or from DDR"),
        ]

    def geo(self, wl: Workload, target: Target, cfg: Mapping[str, Any]) -> GemmGeo:
        return GemmGeo.of(machine(target), wl["m"], wl["k"], wl["n"], cfg, (), batch=wl["b"],
                          shared_b=bool(wl["bcast_b"]))

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        return check_gemm(machine(target), self.geo(wl, target, config), {**config, **FIXED})

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        """matmul's GEMM default on every batch's blocks: 6 x 3 register blocks (18 chains: the 3
        FMACs x 6 cycles of latency), K blocks of 128, B through GSM, the largest C blocks (up to
        256 x 384) whose count keeps the cores busy in (almost) every round, A stages of up to 48
        rows; then shrunk, knob by knob, until everything fits."""
        m = machine(target)
        knobs = {k.name: k.values for k in self.space(wl, target)}

        def pick(name: str, want: int, step: int = 1) -> int:
            vals = [v for v in knobs[name] if v % step == 0] or list(knobs[name])
            return max([v for v in vals if v <= want] or [min(vals)])
        cfg = {"pw": pick("pw", 6), "kv": pick("kv", 3), "rows": 1, "kc": pick("kc", 128), "mb": pick("mb", 256),
               "nb": pick("nb", 384), "dbuf": 1, "w_path": "gsm"}
        mbs = [v for v in (256, 192, 128, 96, 64, 32) if v in knobs["mb"]] or [cfg["mb"]]
        nbs = [v for v in (384, 256, 192, 128, 96) if v in knobs["nb"]] or [cfg["nb"]]
        shapes = sorted(((mb, nb) for mb in mbs for nb in nbs), key=lambda s: (-s[0] * s[1], -s[1]))

        def spread(mb: int, nb: int) -> float:  # core-rounds per block (1.0: every core always busy)
            blocks = wl["b"] * -(-wl["m"] // mb) * -(-wl["n"] // nb)
            return -(-blocks // m.cores) * m.cores / blocks
        cfg["mb"], cfg["nb"] = next((s for s in shapes if spread(*s) <= 1.15), min(shapes, key=lambda s: spread(*s)))
        cfg["rows"] = pick("rows", min(48, cfg["mb"]), cfg["pw"])
        for name in ("nb", "kc", "rows", "mb", "pw"):
            while self.check(wl, target, cfg) is not None:
                smaller = [v for v in knobs[name] if v < cfg[name]]
                if not smaller:
                    break
                cfg[name] = smaller[-1]
                if name == "pw" and cfg["rows"] % cfg["pw"]:
                    cfg["rows"] = pick("rows", cfg["rows"], cfg["pw"])
        why = self.check(wl, target, cfg)
        if why is not None:
            raise OpcError(f"{wl.op} does not fit {target.name} with any tiling of {self.name}: {why}",
                           arg="--shape", expected="a smaller k or n")
        return cfg

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        refuse_invalid(self, wl, target, config)
        m = machine(target)
        g = self.geo(wl, target, config)
        names, ddr, pre = self.tensors(wl)
        out_shape = (wl["b"], wl["m"], wl["n"])
        return gemm_scheduled(m, wl, g, names, ddr, pre, out_shape, {
            "layout_change": "transposes by DMA (counted)" if pre else "none",
            "algo": f"gemm over {wl['b']} batches{' (B shared)' if wl['bcast_b'] else ''}: C blocks {g.mb}x{g.nb} "
                    f"in AM, B blocks {g.kc}x{g.nb} via {g.w_path.upper()}, A stages {g.ms}x{g.kc} in SM, "
                    f"register blocks {g.pw}x{g.kv * m.lanes}"})

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        return gemm_features(machine(target), self.geo(wl, target, config))

    def tensors(self, wl: Workload) -> tuple[dict, dict, list]:
        """The DDR tensors (names, shapes) and the relayouts of transposed operands: (source,
        destination, shape, source strides, leader_only)."""
        b_, m_, k_, n_ = wl["b"], wl["m"], wl["k"], wl["n"]
        names = {"data": "tensor_a", "weight": "tensor_b", "out": "out"}
        ddr = {n: s for n, s, _ in get_op(wl.op).inputs(wl)}
        ddr["out"] = (b_, m_, n_)
        pre: list[tuple] = []
        if wl["trans_a"]:
            names["data"] = "a_rows"
            ddr["a_rows"] = (b_, m_, k_)
            pre.append(("tensor_a", "a_rows", (b_, m_, k_), (k_ * m_, 1, m_), False))
        if wl["trans_b"]:
            names["weight"] = "b_kn"
            if wl["bcast_b"]:
                ddr["b_kn"] = (k_, n_)
                pre.append(("tensor_b", "b_kn", (k_, n_), (1, k_), True))
            else:
                ddr["b_kn"] = (b_, k_, n_)
                pre.append(("tensor_b", "b_kn", (b_, k_, n_), (n_ * k_, 1, k_), False))
        return names, ddr, pre
