"""The DSP element-wise chains lowered from their TVM schedule (schedules/dsp/chain.py) by the
backend's vector-nest lowering (opcompiler/backend/dsp/lower/vector.py): numpy, the same program as
the retired direct emission (kept below as the reference), functional == timing, mutations."""
import random

import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.backend.dsp import program as vx
from opcompiler.backend.dsp.execute import execute
from opcompiler.backend.dsp.timing import timing
from opcompiler.backend.dsp.machine import machine
from opcompiler.backend.dsp.program import F32, Allocator, View, dma_op
from opcompiler.errors import OpcFailure
from opcompiler.ops import get_op, workload
from opcompiler.ops.steps import STEPS
from opcompiler.schedules.dsp.chain import DspChain, _Geo
from opcompiler.schedules.dsp.stream import cdiv, group_key
from opcompiler.target import load_target
from opcompiler.verify import compare

from dsp_lowering import program, stream, vpu_op

T = load_target("dsp-sim")
M = machine(T)
CH = DspChain()


# ------------------------------------------------------------------ the retired direct emission
# (schedules/dsp/chain.py before the TIR route): VPU instruction streams built by hand per step.

def _retired_steps(steps, fulls, chans, chan_load, x="x"):
    out, fi, ci = [], 0, 0
    for name, args in steps:
        if name == "relu":
            out.append(vx.VI("vmax", x, (x, 0.0)))
        elif name == "sigmoid":
            out.append(vx.VI("vmul", "t", (x, -1.0)))
            out += vx.emit_exp("t", "e", "r", "n")
            out.append(vx.VI("vadd", "e", ("e", 1.0)))
            out += vx.emit_rcp("e", x, "t")
        elif name == "clip":
            out += [vx.VI("vmin", x, (x, args[1])), vx.VI("vmax", x, (x, args[0]))]
        elif name == "affine":
            out.append(vx.VI("vfma", x, (x, args[0], args[1])))
        elif name == "pow":
            out += vx.emit_log(x, "t", "n")
            out.append(vx.VI("vmul", "t", ("t", args[0])))
            out += vx.emit_exp("t", x, "r", "n")
        elif name in ("add", "mul"):
            out += [vx.VI("vld", f"f{fi % 2}", (fulls[fi],)),
                    vx.VI("vadd" if name == "add" else "vmul", x, (x, f"f{fi % 2}"))]
            fi += 1
        elif name in ("bias", "scale"):
            out += [vx.VI(chan_load, "p", (chans[ci],)), vx.VI("vadd" if name == "bias" else "vmul", x, (x, "p"))]
            ci += 1
        else:  # bn
            out += [vx.VI(chan_load, "ps", (chans[ci],)), vx.VI(chan_load, "pb", (chans[ci + 1],)),
                    vx.VI("vfma", x, (x, "ps", "pb"))]
            ci += 2
    return out


def _retired_program(wl, config, functional=False):
    from opcompiler.backend.dsp.lower.assemble import assemble, host_ops, nbytes

    op = get_op(wl.op)
    g = _Geo(M, wl, config)
    specs = op.inputs(wl)
    names = [nm for nm, _, _ in specs]
    kinds = ["x"] + [k for name, _ in g.steps for k in STEPS[name].operands]
    fulls = [nm for nm, k in zip(names, kinds) if k == "full"]
    chans = [nm for nm, k in zip(names, kinds) if k == "chan"]
    shares = g.shares(int(config.get("cores", M.cores)), M.cores)
    cache: dict = {}
    L = g.L

    def views(it, base):
        if g.mode == "flat":
            e0, ne = it
            return (e0, (ne,), (1,)), View(("AM",), base, (ne,), (1,)), (cdiv(ne, L),)
        if g.mode == "plane":
            b, c0, nc, s0, ns = it
            pitch = g.pitch or g.chunk
            return (((b * g.c + c0) * g.hw + s0), (nc, ns), (g.hw, 1)), View(("AM",), base, (nc, ns), (pitch, 1)), \
                (nc, cdiv(ns, L))
        p0, np_ = it
        return (p0 * g.c, (np_, g.c), (g.c, 1)), View(("AM",), base, (np_, g.c), (g.pitch, 1)), (np_, cdiv(g.c, L))

    def stage(it, slot, bufs, par):
        tag = f"in{slot}"
        ins = []
        for nm, base in zip([names[0]] + fulls, bufs):
            (off, shape, strides), amv, _ = views(it, base)
            ins.append(dma_op(M, View(("DDR", nm), off, shape, strides), amv, (), (tag,), functional, "in"))
        (off, shape, strides), amv, outer = views(it, bufs[0])
        if g.mode == "flat":
            steps, load, cm = (L,), "sld", []
        elif g.mode == "plane":
            steps, load = (g.pitch or g.chunk, L), "sld"
            cm = [vx.Mem("SM", p + it[1], (1, 0), 0) for p in par]
        else:
            steps, load = (g.pitch, L), "vld"
            cm = [vx.Mem("AM", p, (0, L), 1) for p in par]
        fm = [vx.Mem("AM", b, steps) for b in bufs[1:]]
        body = [vx.VI("vld", "x", (vx.Mem("AM", bufs[0], steps),))] + _retired_steps(g.steps, fm, cm, load)
        body.append(vx.VI("vst", vx.Mem("AM", bufs[0], steps), ("x",)))
        kern = vx.VKernel((vx.Nest(outer=outer, post=tuple(body)),), "ew_chain")
        comp = [vpu_op(M, kern, (tag, "const"), (tag,), functional, "chain")]
        outs = [dma_op(M, amv, View(("DDR", "out"), off, shape, strides), (tag,), ("out",), functional, "out")]
        return ins, comp, outs

    def core_ops(core):
        items = shares[core]
        if not items:
            return []
        am = Allocator("AM", M.cap("AM"), 128)
        bufs = [[am.alloc(f"{nm}[{b}]", g.buf + g.L) for nm in ["x"] + fulls] for b in range(g.nbuf)]
        ops, par = [], []
        for j, nm in enumerate(chans):
            off, lv = (j * g.c, "SM") if g.mode == "plane" else (am.alloc(nm, g.pitch), "AM")
            par.append(off)
            ops.append(dma_op(M, View(("DDR", nm), 0, (g.c,), (1,)), View((lv,), off, (g.c,), (1,)), (), ("const",),
                              functional, "par"))
        return ops + stream(items, g.nbuf, functional, lambda it, slot, first: stage(it, slot, bufs[slot], par),
                            g.key, cache)

    out_shape = tuple(int(v) for v in op.output_spec(wl)[0])
    ddr = {nm: s for nm, s, _ in specs}
    ddr["out"] = out_shape
    hpre, hpost = host_ops(M, [(nm, nbytes(s)) for nm, s, _ in specs], [("out", nbytes(out_shape))], [])
    return assemble(M, functional=functional, cores=M.cores, core_ops=core_ops,
                    group_key=lambda c: group_key(shares[c], g.key), pre=[], post=[], host_pre=hpre, host_post=hpost,
                    ddr_tensors=ddr, inputs=names, output="out", out_shape=out_shape, flops=op.flops(wl),
                    cores_used=sum(1 for s in shares if s))


# ------------------------------------------------------------------ helpers

def _inputs(wl, seed):
    xs = get_op(wl.op).make_inputs(wl, seed)
    if "pow" in str(wl.p.get("chain", "")):  # pow: x > 0
        xs = [np.abs(x) + 0.1 for x in xs]
    return xs


def _numpy_ok(wl, cfg, seed=0, **kw):
    xs = _inputs(wl, seed)
    out, _ = execute(M, program(CH, wl, T, cfg, True, **kw), xs)
    return compare(out, get_op(wl.op).reference(wl, xs))


def _mode(wl):
    return _Geo(M, wl, {"tile": 1024, "dbuf": 0}).mode


# ------------------------------------------------------------------ numpy, per op and mode

CASES = [
    ("relu", "n=2,c=5,h=7,w=9", "flat"),
    ("relu", "n=3,c=5,h=17,w=13,layout=NHWC", "flat"),
    ("add", "n=2,c=5,h=7,w=9,layout=NHWC", "flat"),
    ("add_relu", "n=2,c=5,h=7,w=9", "flat"),
    ("add_relu", "n=2,c=37,h=3,w=5,layout=NHWC,bcast=1", "pixel"),
    ("add_relu", "n=2,c=7,h=5,w=6,bcast=1", "plane"),
    ("bias_add", "n=2,c=7,h=5,w=6", "plane"),
    ("batch_norm", "n=3,c=40,h=5,w=5,layout=NHWC", "pixel"),
    ("bn_relu", "n=2,c=13,h=19,w=19", "plane"),
    ("bn_relu", "n=3,c=64,h=5,w=5,layout=NHWC", "pixel"),
    ("ew_chain", "n=2,c=3,h=9,w=11,chain=sigmoid", "flat"),
    ("ew_chain", "n=2,c=37,h=3,w=5,layout=NHWC,chain=scale;add;clip:-0.5:0.5", "pixel"),
    ("ew_chain", "n=1,c=3,h=50,w=50,chain=affine:0.2:0.5;clip:0:1;mul", "flat"),
    ("ew_chain", "n=3,c=6,h=1,w=1,chain=bias;sigmoid;mul", "plane"),
    ("ew_chain", "n=1,c=2,h=40,w=40,chain=scale;relu", "plane"),  # planes cut in chunks at tile 1024
    ("ew_chain", "n=2,c=3,h=5,w=7,chain=affine:0.5:1.0;pow:-0.75;mul", "flat"),
    ("ew_chain", "n=2,c=9,h=5,w=7,layout=NHWC,chain=sigmoid;sigmoid;add;bn;mul", "pixel"),
]


@pytest.mark.parametrize("op,shape,mode", CASES)
def test_matches_numpy_through_the_backend(op, shape, mode):
    wl = workload(op, shape=shape, dtype="float32")
    assert _mode(wl) == mode
    be = get_backend(T)
    k = be.build(wl, "default")
    assert k.info["lowering"] == "tir" and k.info["lanes"] == mode
    d = get_op(op)
    xs = _inputs(wl, 3)
    res = be.run(k, xs)
    ok, err = compare(res.outputs[0], d.reference(wl, xs))
    assert ok, err
    # functional mode: the same cycles and the same issued work as the timing program
    timed = be.measure(k)  # run reports the timing clock, and beside it the functional replay's own:
    assert res.cycles == timed.cycles  # equal without core groups, else within 15 % of the device cycles
    fun = res.metrics["functional_cycles"]  # (identical cores timed as one group, tests/sim/test_crosscheck.py)
    assert fun == timed.cycles if max(k.artifact["program"].multiplicity) == 1 else \
        abs(fun - timed.cycles) <= 0.15 * timed.metrics["dsp_cycles"], (fun, timed.cycles)
    assert res.metrics["functional_counters"] == res.metrics["counters"]


def test_plane_chunks_and_batch_split():
    """A plane larger than the tile is cut in chunks (SM scalar per chunk); split=batch keeps
    whole images per core; both with and without double buffering."""
    wl = workload("ew_chain", shape="n=3,c=2,h=40,w=40,chain=scale;relu", dtype="float32")
    for cfg in ({"tile": 1024, "dbuf": 1, "cores": 2, "split": "items"},
                {"tile": 1024, "dbuf": 0, "cores": 8, "split": "batch"}):
        assert _numpy_ok(wl, cfg)[0], cfg


# ------------------------------------------------------------------ parity with the retired emission

# The fixed ops issue exactly the retired emitter's instructions (same registers). ew_chain may do
# better: its per-step registers (ps / pb of bn, t / e of sigmoid, ...) were private to each step,
# the lowering reuses temporaries across steps (more iterations in flight in the register window),
# and a per-channel multiply feeding a per-channel add (scale;bias) is one FMA.
PARITY = CASES + [
    ("ew_chain", "n=4,c=33,h=19,w=19,chain=scale;bias;pow:2", "plane"),
    ("ew_chain", "n=2,c=3,h=5,w=7,chain=scale;bias", "plane"),
    ("ew_chain", "n=4,c=64,h=19,w=19,layout=NHWC,chain=bn;sigmoid;add", "pixel"),
]


@pytest.mark.parametrize("op,shape,mode", PARITY)
def test_same_cycles_as_the_retired_emission(op, shape, mode):
    """15 random valid configs: the same cycles and counters as the hand-built emission (ew_chain:
    the same bytes, DMAs, loads and stores, at most its FMAs and cycles); numpy on three."""
    wl = workload(op, shape=shape, dtype="float32")
    rng = random.Random(sum(map(ord, shape)))
    done = tries = 0
    while done < 15 and tries < 200:
        tries += 1
        cfg = CH.random_config(wl, T, rng) if done else CH.default(wl, T)
        if CH.check(wl, T, cfg) is not None:
            continue
        new = timing(M, program(CH, wl, T, cfg, False))
        old = timing(M, _retired_program(wl, cfg))
        nc, oc = new.counters.as_dict(), old.counters.as_dict()
        if op == "ew_chain":
            assert new.cycles <= old.cycles, cfg
            assert nc["fmas"] <= oc["fmas"], cfg
            assert {k: v for k, v in nc.items() if k != "fmas"} == {k: v for k, v in oc.items() if k != "fmas"}, cfg
        else:
            assert new.cycles == old.cycles, cfg
            assert nc == oc, cfg
        if done < 3:
            assert _numpy_ok(wl, cfg, seed=done)[0], cfg
        done += 1
    assert done == 15


# ------------------------------------------------------------------ mutations

def test_a_shifted_dma_offset_gives_a_wrong_result():
    wl = workload("bn_relu", shape="n=2,c=40,h=5,w=5,layout=NHWC", dtype="float32")
    cfg = CH.default(wl, T)
    assert _numpy_ok(wl, cfg)[0]

    def shift(name, v):  # x lands one element off in AM
        return View(v.space, v.offset + 1, v.shape, v.strides) if name.startswith("x->") else v
    assert not _numpy_ok(wl, cfg, tamper=shift)[0]


def _rewrite(fix):
    def f(k):
        return vx.VKernel(tuple(vx.Nest(outer=n.outer, post=tuple(fix(i) for i in n.post)) for n in k.nests), k.label)
    return f


@pytest.mark.parametrize("op,shape,fix", [
    ("relu", "n=2,c=5,h=7,w=9",  # a wrong instruction: max -> min
     lambda i: vx.VI("vmin", i.dst, i.srcs) if i.op == "vmax" else i),
    ("bn_relu", "n=2,c=13,h=9,w=9",  # a per-channel scalar one plane off
     lambda i: vx.VI(i.op, i.dst, (vx.Mem("SM", i.srcs[0].base + 1, i.srcs[0].steps, 0),)) if i.op == "sld" else i),
    ("ew_chain", "n=2,c=3,h=9,w=11,chain=sigmoid",  # exp's polynomial one term short
     lambda i: vx.VI("vmul", i.dst, (i.srcs[0], 1.0)) if i.op == "vldexp" else i),
])
def test_a_wrong_vector_instruction_or_operand_gives_a_wrong_result(op, shape, fix):
    wl = workload(op, shape=shape, dtype="float32")
    cfg = CH.default(wl, T)
    assert _numpy_ok(wl, cfg)[0]
    assert not _numpy_ok(wl, cfg, vtamper=_rewrite(fix))[0]


# ------------------------------------------------------------------ the lowering itself

def test_instructions_recognised_from_the_expression():
    """bn;relu in NHWC: x loaded, scale and shift loaded as channel vectors, one FMA, one max,
    one store; the per-channel vectors do not move with the pixel (step 0)."""
    wl = workload("bn_relu", shape="n=2,c=40,h=5,w=5,layout=NHWC", dtype="float32")
    seen = []

    def spy(k):
        seen.append(k)
        return k
    program(CH, wl, T, CH.default(wl, T), True, vtamper=spy)
    ops = [i.op for i in seen[0].nests[0].post]
    assert ops == ["vld", "vld", "vld", "vfma", "vmax", "vst"]
    scale = seen[0].nests[0].post[1].srcs[0]
    assert scale.level == "AM" and scale.steps == (0, M.lanes) and scale.lane == 1
    assert seen[0].nests[0].outer[-1] == cdiv(40, M.lanes)


def test_an_unmappable_expression_is_a_one_line_failure():
    import tvm
    from tvm import te

    from opcompiler.backend.dsp.lower.vector import VecLowerer
    from opcompiler.backend.dsp.lower.direct import lowered

    x = te.placeholder((64,), name="x")
    y = te.compute((64,), lambda i: te.sqrt(x[i]), name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    b = sch.get_sblock("y")
    so, _ = sch.split(sch.get_loops(b)[0], [None, 32])
    o = sch.cache_write(b, 0, "local.AM")
    sch.reverse_compute_at(o, so)
    r = sch.cache_read(b, 0, "local.AM")
    sch.compute_at(r, so)
    sch.annotate(so, "opc.dsp.stage", 1)
    sch.annotate(so, "opc.dsp.cores", 1)
    for blk in (r, b, o):
        sch.annotate(sch.get_loops(blk)[1], "opc.dsp.op", "dma" if blk is not b else "vec")
    low = VecLowerer(M, lowered(sch), {"y": "out"}, {"x": (64,), "out": (64,)}, False, True)
    with pytest.raises(OpcFailure, match=r"vector nest over .*: no vector instruction for tirx.sqrt") as e:
        low.core_ops(0, 1, 1)
    assert "\n" not in str(e.value)


def test_in_place_tiles_fit_what_the_template_checks():
    """The result takes x's AM tile (computed in place): the largest tile the template accepts
    builds (AM capacity as `check` counts it)."""
    wl = workload("ew_chain", shape="n=4,c=64,h=32,w=32,chain=add", dtype="float32")
    cfg = {"tile": 32768, "dbuf": 1, "cores": 8, "split": "items"}
    assert CH.check(wl, T, cfg) is None
    g = _Geo(M, wl, cfg)
    assert g.am_elems() * F32 > M.cap("AM") // 2  # a separate output tile would not fit
    timing(M, program(CH, wl, T, cfg, False))
