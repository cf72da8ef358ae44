"""dsp-sim template for the matmul family (matmul, matmul_bias_relu, matmul_bias), two algorithms:

* `algo=fc`: the fully connected layer of seed 004 Algorithm 2 -- rows of the input (the batch)
  split across the cores, the output features vectorized on the lanes, the whole reduction
  accumulated in registers; lowered as a 1x1 direct convolution over rows (h = M, w = 1), so it
  shares the conv lowering and simulator. Right for the small layers (MiniGo's FC), where the
  whole B of a block of output features fits AM.
* `algo=gemm` (`gemm.py`): a GEMM blocked for GSM / SM / AM as the FT-M7032 GEMM libraries do:
  C blocks (`mb` x `nb`) resident in AM over the reduction, B blocks (`kc` x `nb`) through GSM
  (shared by the cores) or from DDR, A stages (`rows` x `kc`) broadcast from SM, register blocks
  of `pw` x `kv` vectors keeping the 3 FMACs busy; the default for large problems."""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.dsp.intrin import machine
from opcompiler.errors import OpcError
from opcompiler.ops import get_op
from opcompiler.target import Target
from opcompiler.template_base import Knob, Scheduled, register_template
from opcompiler.workload import Workload

from .common import capacity_why, epilogue_steps, refuse_invalid, require_fp32
from .direct import ConvSpec, DirectConfig, DirectTemplate, check
from .gemm import KC, MB, NB, GemmGeo, check_gemm, gemm_features
from .gemm import scheduled as gemm_scheduled
from .ksplit import footprint_k
from .ksplit import scheduled as ksplit_scheduled

# the epilogue steps (`opcompiler.ops.steps`) the fully connected layer lowers, in its order: a
# matmul-family op runs here when its catalogue entry's `epilogue` is made of them
EPI_STEPS = {"bias": "bias", "relu": "relu"}
GEMM_MIN = 256  # m, n and k at least this: the template default is the blocked GEMM


def _upto(values: tuple[int, ...], n: int) -> tuple[int, ...]:
    """The values below n and the first one >= n (larger ones would clip to the same block)."""
    below = tuple(v for v in values if v < n)
    above = [v for v in values if v >= n]
    return below + tuple(above[:1])


@register_template
class DspFullyConnected(DirectTemplate):
    """C[M, N] = A[M, K] @ B[K, N] (+ bias, ReLU): M across cores, N on the lanes, K in registers."""

    name = "dsp.fully_connected"
    op_families = ("matmul",)
    # 2: algo=gemm and its knobs kc, mb, nb; 3: no `lowering` knob (algo=fc split=items is lowered
    # from TIR); 4: split=k and algo=gemm lowered from TIR too (split=k cycles moved by up to 0.02 %)
    version = 4

    def spec(self, wl: Workload, target: Target) -> ConvSpec:
        require_fp32(wl, target)
        epi = epilogue_steps(wl, EPI_STEPS, "fully-connected")
        m_, k_, n_ = wl["m"], wl["k"], wl["n"]
        return ConvSpec(n=1, h=m_, w=1, c=k_, k=n_, r=1, s=1, stride=1, pad=0, dil=1, ho=m_, wo=1, epi=epi,
                        kind="matmul")

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        sp = self.spec(wl, target)
        kvmax = max(1, min(12, -(-sp.k // machine(target).lanes)))
        rows = tuple(v for v in (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128) if v <= sp.h) or (1,)
        return [
            Knob("pw", tuple(v for v in (1, 2, 3, 4, 6, 8, 12, 16) if v <= sp.h) or (1,), "input rows per register block"),
            Knob("kv", tuple(range(1, kvmax + 1)), "vectors of 32 output features per register block"),
            Knob("rows", rows, "input rows per DMA stage"),
            Knob("cols", (1,), "(one output column: the layer is a 1x1 convolution over rows)"),
            Knob("order", ("out",), "accumulate the reduction in registers (Algorithm 2)"),
            Knob("dbuf", (1, 0), "double-buffer SM/AM tiles"),
            Knob("w_path", ("gsm", "ddr", "host_copies"), "how weights reach each core's AM"),
            Knob("out_path", ("ddr", "gsm"), "AM -> DDR, or through GSM"),
            Knob("split", ("items", "k"), "row blocks across the cores, or the reduction (partials reduced in GSM)"),
            Knob("algo", ("fc", "gemm"), "fc: Algorithm 2 (whole reduction in registers); gemm: blocked for "
                 "GSM/SM/AM (C blocks in AM, B blocks via GSM or DDR, A stages of `rows` rows in SM)"),
            Knob("kc", _upto(KC, sp.c), "gemm: reduction steps per K block"),
            Knob("mb", _upto(MB, sp.h), "gemm: rows of the C block a core keeps in AM"),
            Knob("nb", _upto(NB, -(-sp.k // 32) * 32), "gemm: columns of the C block (and of the B blocks)"),
        ]

    def _fill(self, wl: Workload, target: Target, cfg: dict[str, Any]) -> dict[str, Any]:
        """An fc config with the gemm-only knobs at their gemm defaults (unused by algo=fc)."""
        g = self._gemm_default(wl, target)
        return {**cfg, "algo": "fc", "kc": g["kc"], "mb": g["mb"], "nb": g["nb"]}

    def _gemm_default(self, wl: Workload, target: Target) -> dict[str, Any]:
        """6 x 3 register blocks (18 chains: the 3 FMACs x 6 cycles of latency), K blocks of 128,
        B through GSM, the largest C blocks (up to 256 x 384) that keep the cores busy in (almost)
        every round, A stages of 48 rows (a multiple of the register block), shrunk until
        everything fits."""
        sp = self.spec(wl, target)
        m = machine(target)
        knobs = {k.name: k.values for k in self.space(wl, target)}

        def pick(name: str, want: int, step: int = 1) -> int:
            vals = [v for v in knobs[name] if v % step == 0] or list(knobs[name])
            return max([v for v in vals if v <= want] or [min(vals)])
        cfg = {"pw": pick("pw", 6), "kv": pick("kv", 3), "rows": 1, "cols": 1, "order": "out", "dbuf": 1,
               "w_path": "gsm", "out_path": "ddr", "split": "items", "algo": "gemm",
               "kc": pick("kc", 128), "mb": pick("mb", 256), "nb": pick("nb", 384)}
        mbs = [v for v in (256, 192, 128, 96, 64, 32) if v in knobs["mb"]] or [cfg["mb"]]
        nbs = [v for v in (384, 256, 192, 128, 96) if v in knobs["nb"]] or [cfg["nb"]]
        shapes = sorted(((mb, nb) for mb in mbs for nb in nbs), key=lambda s: (-s[0] * s[1], -s[1]))

        def spread(mb: int, nb: int) -> float:  # core-rounds per block (1.0: every core always busy)
            blocks = -(-sp.h // mb) * -(-sp.k // nb)
            return -(-blocks // m.cores) * m.cores / blocks
        cfg["mb"], cfg["nb"] = next((s for s in shapes if spread(*s) <= 1.15), min(shapes, key=lambda s: spread(*s)))
        cfg["rows"] = pick("rows", min(48, cfg["mb"]), cfg["pw"])
        for name in ("nb", "kc", "rows", "mb"):
            while check_gemm(m, self._geo(wl, target, cfg), cfg) is not None:
                smaller = [v for v in knobs[name] if v < cfg[name]]
                if not smaller:
                    break
                cfg[name] = smaller[-1]
        return cfg

    def _geo(self, wl: Workload, target: Target, cfg: Mapping[str, Any]) -> GemmGeo:
        sp = self.spec(wl, target)
        return GemmGeo.of(machine(target), sp.h, sp.c, sp.k, cfg, sp.epi)

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        sp = self.spec(wl, target)
        if min(sp.h, sp.c, sp.k) >= GEMM_MIN:
            g = self._gemm_default(wl, target)
            if self.check(wl, target, g) is None:
                return g
        knobs = {k.name: k.values for k in self.space(wl, target)}
        per_core = -(-sp.h // machine(target).cores)
        rows_ok = sorted((r for r in knobs["rows"] if r <= per_core), reverse=True) or [knobs["rows"][0]]
        for kv in sorted(knobs["kv"], reverse=True):
            for rows in rows_ok:
                for pw in (6, 4, 2, 1):
                    cfg = self._fill(wl, target, {
                        "pw": min(pw, max(knobs["pw"])), "kv": kv, "rows": rows, "cols": 1, "order": "out", "dbuf": 1,
                        "w_path": "gsm", "out_path": "ddr", "split": "items"})
                    if self.check(wl, target, cfg) is None:
                        return cfg
        # Algorithm 2 keeps the whole reduction on the lanes: a long K (VGG's 25,088-deep fc) does
        # not fit AM. The blocked GEMM walks K in blocks, at any M; failing that, the first config of
        # the space that fits, and a one-line refusal when none does
        g = self._gemm_default(wl, target)
        if self.check(wl, target, g) is None:
            return g
        for c in self.iter_space(wl, target):
            c = self._fill(wl, target, c) if c.get("algo") != "gemm" else c
            if self.check(wl, target, c) is None:
                return c
        raise OpcError(f"{wl.op} does not fit {target.name} with any tiling of {self.name}: "
                       f"{self.check(wl, target, cfg)}", arg="--shape", expected="a smaller k or n")

    def paper(self, wl: Workload, target: Target) -> dict[str, Any]:
        """Algorithm 2 as written: one input row at a time broadcast from SM, all output
        features on the lanes (as many vectors as AM and the registers allow), each core its
        share of the rows, W broadcast from DDR into every core's AM, no double buffering."""
        sp = self.spec(wl, target)
        m = machine(target)
        knobs = {k.name: k.values for k in self.space(wl, target)}
        per_core = -(-sp.h // m.cores)
        rows_ok = sorted((r for r in knobs["rows"] if r <= per_core), reverse=True) or [1]
        for kv in sorted(knobs["kv"], reverse=True):
            for rows in rows_ok:
                cfg = self._fill(wl, target, {"pw": 1, "kv": kv, "rows": rows, "cols": 1, "order": "out", "dbuf": 0,
                                              "w_path": "ddr", "out_path": "ddr", "split": "items"})
                if check(m, sp, DirectConfig.of(cfg)) is None:
                    return cfg
        return cfg

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        sp = self.spec(wl, target)
        if config.get("algo") == "gemm":
            return check_gemm(machine(target), self._geo(wl, target, config), config)
        cf = DirectConfig.of(config)
        if cf.w_path == "host_copies" and wl.p.get("trans_b"):
            return "w_path=host_copies replicates B as stored; use gsm or ddr with trans_b=1"
        m = machine(target)
        if cf.split != "k":
            return check(m, sp, cf)
        if cf.w_path != "ddr" or cf.out_path != "ddr" or cf.order != "out":
            return "split=k loads weight slices from DDR and stores from AM: use w_path=ddr, out_path=ddr, order=out"
        return capacity_why(m, footprint_k(m, sp, cf))

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        """The scheduled module of this config's algorithm; `split="k"` splits the reduction and
        reduces in GSM."""
        if config.get("algo") == "gemm":
            return self._apply_gemm(wl, target, config)
        if config.get("split") != "k":
            return super().apply(wl, target, config)
        refuse_invalid(self, wl, target, config)
        return ksplit_scheduled(self, wl, target, config)

    def _apply_gemm(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        m = machine(target)
        sp = self.spec(wl, target)
        refuse_invalid(self, wl, target, config)
        names, ddr, pre, _, out_shape = self.tensors(wl, sp)
        g = self._geo(wl, target, config)
        return gemm_scheduled(m, wl, g, names, ddr, pre, out_shape, {
            "layout_change": "transposes by DMA (counted)" if pre else "none",
            "algo": f"gemm: C blocks {g.mb}x{g.nb} in AM, B blocks {g.kc}x{g.nb} via {g.w_path.upper()}, "
                    f"A stages {g.ms}x{g.kc} in SM, register blocks {g.pw}x{g.kv * m.lanes}"})

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        if config.get("algo") == "gemm":
            return gemm_features(machine(target), self._geo(wl, target, config))
        if config.get("split") != "k":
            return super().features(wl, target, config)
        m, sp, cf, fp, kbp, nk = self._basis(wl, target, config, footprint_k)
        blocks = nk * -(-sp.h // cf.rows)
        ddr = (sp.c * sp.k + nk * sp.h * sp.c + sp.h * sp.k) * 4  # W once, I per channel block, C out
        return {"ddr_bytes": float(ddr), "gsm_bytes": float(2 * blocks * m.cores * cf.rows * kbp * 4),
                "arith_intensity": 2 * sp.h * sp.c * sp.k / ddr, "am_occupancy": fp["AM"] / m.cap("AM"),
                "sm_occupancy": fp["SM"] / m.cap("SM"), "gsm_occupancy": fp["GSM"] / m.cap("GSM"),
                "reg_occupancy": fp["REG"] / m.registers, "lane_use": sp.k / (nk * kbp), "stages": float(blocks),
                "work_per_core": float(blocks), "cores_busy": float(min(m.cores, sp.c)), "barriers": 2.0 * blocks}

    def tensors(self, wl: Workload, sp: ConvSpec) -> tuple[dict, dict, list, list, tuple]:
        m_, k_, n_ = wl["m"], wl["k"], wl["n"]
        names = {"data": "tensor_a", "weight": "tensor_b", "out": "out", "bias": "bias"}
        ddr = {n: s for n, s, _ in get_op(wl.op).inputs(wl)}
        ddr["out"] = (m_, n_)
        pre: list[tuple] = []  # (source, destination, shape, source strides, leader_only)
        if wl.p.get("trans_a"):
            names["data"] = ddr["a_rows"] = "a_rows"
            ddr["a_rows"] = (m_, k_)
            pre.append(("tensor_a", "a_rows", (m_, k_), (1, m_), False))
        if wl.p.get("trans_b"):
            names["weight"] = "b_kn"
            ddr["b_kn"] = (k_, n_)
            pre.append(("tensor_b", "b_kn", (k_, n_), (1, k_), True))
        return names, ddr, pre, [], (m_, n_)
