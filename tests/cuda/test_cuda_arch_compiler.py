"""Which architecture `--target cuda` means, which compiler builds it, and what the binary holds.

No GPU is needed: the GPU's compute capability is simulated by replacing `device_arch` (what
TVM's device API reports on a GPU machine); the binaries are real (nvcc here; NVRTC where
cuda-bindings is installed) and read back with `fatbin_entries` (the fatbin container: one
image per architecture, cubin or PTX) and the cubin's own ELF header.
"""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from opcompiler import device as gpu_device
from opcompiler.backend import cuda
from opcompiler.backend import cuda_compile as cc
from opcompiler.backend.cuda import CudaBackend, cuda_source, has_gpu, tvm_cuda_target
from opcompiler.errors import OpcError
from opcompiler.ops import workload
from opcompiler.target import load_target

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA toolkit) is not installed")

SM80, SM90 = load_target("cuda-sm80"), load_target("cuda-sm90")
SMALL = workload("matmul", "m=32,k=64,n=48", dtype="float16")


@pytest.fixture
def gpu_is(monkeypatch):
    """Pretend this machine has a GPU of the given compute capability (as TVM's device API reports it)."""
    def set_arch(arch: str | None) -> None:
        monkeypatch.setattr(gpu_device, "device_arch", lambda device=0: arch)
        monkeypatch.setattr(gpu_device, "has_gpu", lambda: arch is not None)
        cuda.resolve_auto_target.cache_clear()
    yield set_arch
    cuda.resolve_auto_target.cache_clear()


# ------------------------------------------------------------------ --target cuda

@pytest.mark.skipif(has_gpu(), reason="this machine has a GPU: `cuda` resolves to it")
def test_cuda_without_a_gpu_is_the_stated_default():
    cuda.resolve_auto_target.cache_clear()
    t = load_target("cuda")
    assert t.name == cuda.DEFAULT_TARGET == "cuda-sm80" and t.extra["arch"] == "sm_80"


@pytest.mark.parametrize("device,expected", [("sm_80", "cuda-sm80"), ("sm_90", "cuda-sm90"),
                                             ("sm_86", "cuda-sm80"), ("sm_89", "cuda-sm80"),
                                             ("sm_100", "cuda-sm90"), ("sm_120", "cuda-sm90")])
def test_cuda_resolves_to_the_gpu_present(gpu_is, capsys, device, expected):
    gpu_is(device)
    t = load_target("cuda")
    assert t.name == expected
    note = capsys.readouterr().err
    if t.extra["arch"] == device:
        assert note == ""
    else:  # no file for this GPU: the newest older one, said in one line
        assert note.count("\n") == 1 and device in note and expected in note and "PTX" in note


def test_a_gpu_older_than_every_target_is_refused(gpu_is):
    gpu_is("sm_75")
    with pytest.raises(OpcError) as e:
        load_target("cuda")
    msg = str(e.value)
    assert "sm_75" in msg and "cuda-sm80 (sm_80)" in msg and "\n" not in msg


def test_an_older_target_is_served_on_a_newer_gpu_and_a_newer_one_refused(gpu_is):
    gpu_is("sm_90")
    cuda.check_servable(SM80)  # sm_80 cubin + compute_80 PTX: the driver JIT-compiles the PTX for sm_90
    cuda.check_servable(SM90)
    gpu_is("sm_80")
    with pytest.raises(OpcError) as e:
        cuda.check_servable(SM90)
    msg = str(e.value)
    assert "cuda-sm90" in msg and "sm_90" in msg and "sm_80" in msg and "\n" not in msg


def test_cli_refuses_a_target_the_gpu_cannot_run_in_one_line(gpu_is, capsys):
    from opcompiler.cli import main
    gpu_is("sm_80")
    assert main(["run", "matmul", "--target", "cuda-sm90", "--shape", "m=32,k=64,n=48", "--dtype", "float16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "sm_90" in err and "sm_80" in err and "--target cuda" in err
    assert main(["tune", "matmul", "--target", "cuda-sm90", "--trials", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "sm_90" in err and "sm_80" in err


# ------------------------------------------------------------------ the compiler

def test_compiler_choice(monkeypatch):
    """NVRTC when cuda-bindings imports (and the CUDA headers are found), nvcc otherwise."""
    monkeypatch.delenv("OPC_CUDA_COMPILER", raising=False)
    real = cc.nvrtc_available()
    assert cc.cuda_compiler() == ("nvrtc" if real else "nvcc")
    monkeypatch.setattr(cc, "nvrtc_available", lambda: True)
    assert cc.cuda_compiler() == "nvrtc"
    monkeypatch.setattr(cc, "nvrtc_available", lambda: False)
    assert cc.cuda_compiler() == "nvcc"
    monkeypatch.setenv("OPC_CUDA_COMPILER", "nvcc")
    assert cc.cuda_compiler() == "nvcc"


def test_missing_compiler_is_one_line_exit_2(monkeypatch, capsys):
    from opcompiler.cli import main
    monkeypatch.delenv("OPC_CUDA_COMPILER", raising=False)
    monkeypatch.setattr(cc, "nvrtc_available", lambda: False)
    monkeypatch.setattr(cc, "_has_nvcc", lambda: False)
    assert main(["build", "matmul", "--target", "cuda-sm80", "--shape", "m=32,k=64,n=48", "--dtype", "float16",
                 "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "opcompiler[cuda]" in err and "nvcc" in err


@pytest.mark.skipif(cc.nvrtc_available(), reason="cuda-bindings is installed: NVRTC is available")
def test_forcing_nvrtc_without_cuda_bindings_says_what_to_install(monkeypatch):
    monkeypatch.setenv("OPC_CUDA_COMPILER", "nvrtc")
    with pytest.raises(OpcError, match=r"pip install 'opcompiler\[cuda\]'"):
        cc.cuda_compiler()


# ------------------------------------------------------------------ what the module embeds

@pytest.fixture(scope="module")
def built() -> dict:
    return {t.name: CudaBackend(t).build(SMALL) for t in (SM80, SM90)}


@pytest.mark.parametrize("name,sm", [("cuda-sm80", 80), ("cuda-sm90", 90)])
def test_binary_holds_the_cubin_and_its_ptx(built, name, sm):
    """The build's binary is a fatbin: the sm_XX cubin (its ELF header says sm_XX) and compute_XX PTX
    (`.target sm_XX`), i.e. `nvcc -gencode arch=compute_XX,code=[sm_XX,compute_XX]`."""
    k = built[name]
    assert k.info["cuda_compiler"] == cc.cuda_compiler()
    assert k.info["binary"] == "fatbin" and k.info["ptx_embedded"] is True
    binary = cc.compile_cuda(cuda_source(k), f"sm_{sm}")  # the cached result the build and TVM's hook share
    images = cc.fatbin_entries(binary.data)
    assert sorted((e["kind"], e["arch"]) for e in images) == [("elf", sm), ("ptx", sm)]
    elf = next(e for e in images if e["kind"] == "elf")
    cubin = binary.data[elf["offset"]:elf["offset"] + elf["bytes"]]
    assert cubin[:4] == b"\x7fELF" and cc.elf_arch(cubin) == sm
    ptx = next(e for e in images if e["kind"] == "ptx")
    text = binary.data[ptx["offset"]:ptx["offset"] + ptx["bytes"]].decode(errors="replace")
    assert f".target sm_{sm}" in text and ".entry main_kernel" in text and "mma.sync" in text
    assert k.info["registers_per_thread"] > 0 and k.info["spill_bytes"] == 0


def test_fatbin_reader_tells_sass_only_from_sass_plus_ptx(tmp_path):
    """The reader against nvcc's own fatbins: code=sm_80 holds one ELF image, code=[sm_80,compute_80]
    an ELF and a PTX image (compressed by default: the reader still sees it)."""
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(float* a) { a[threadIdx.x] *= 2.f; }\n')
    got = {}
    for name, code in (("sass", "sm_80"), ("both", "[sm_80,compute_80]")):
        out = tmp_path / f"{name}.fatbin"
        subprocess.run([cc.nvcc_path(), "--fatbin", "-gencode", f"arch=compute_80,code={code}", "-o", str(out),
                        str(src)], check=True, capture_output=True)
        got[name] = [(e["kind"], e["arch"]) for e in cc.fatbin_entries(out.read_bytes())]
    assert got == {"sass": [("elf", 80)], "both": [("elf", 80), ("ptx", 80)]}
    with pytest.raises(ValueError, match="not a fatbin"):
        cc.fatbin_entries(b"\x7fELF" + bytes(60))


@pytest.mark.skipif(shutil.which("fatbinary") is None, reason="the toolkit's fatbinary tool is not installed")
def test_nvrtc_fallback_packs_cubin_and_ptx_with_fatbinary(tmp_path, monkeypatch):
    """Without nvFatbin, NVRTC's cubin and PTX are packed by the toolkit's `fatbinary`."""
    import builtins
    real_import = builtins.__import__

    def no_nvfatbin(name, *a, **k):
        if name == "cuda.bindings" and a and a[2] and "nvfatbin" in a[2]:
            raise ImportError("no nvfatbin here")
        return real_import(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_nvfatbin)
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(float* a) { a[threadIdx.x] *= 2.f; }\n')
    for fmt in ("cubin", "ptx"):
        subprocess.run([cc.nvcc_path(), f"--{fmt}", "-arch=sm_90" if fmt == "cubin" else "-arch=compute_90", "-o",
                        str(tmp_path / f"k.{fmt}"), str(src)], check=True, capture_output=True)
    fat = cc.make_fatbin((tmp_path / "k.cubin").read_bytes(), (tmp_path / "k.ptx").read_bytes(), "90")
    assert fat is not None
    assert [(e["kind"], e["arch"]) for e in cc.fatbin_entries(fat)] == [("elf", 90), ("ptx", 90)]


def test_compile_hook_builds_for_the_target_in_scope():
    """TVM's `tvm_callback_cuda_compile` (called inside tvm.compile where TVM has its CUDA runtime, or
    when a module that kept its source is loaded) builds for the current TVM target's arch."""
    src = 'extern "C" __global__ void k(float* a) { a[threadIdx.x] += 1.f; }\n'
    with tvm_cuda_target(SM90):
        fat = bytes(cuda._tvm_compile_hook(src))
    assert sorted((e["kind"], e["arch"]) for e in cc.fatbin_entries(fat)) == [("elf", 90), ("ptx", 90)]


def test_build_json_says_which_compiler(capsys):
    from opcompiler.cli import main
    assert main(["build", "matmul", "--target", "cuda-sm80", "--shape", "m=32,k=64,n=48", "--dtype", "float16",
                 "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["cuda_compiler"] == cc.cuda_compiler() and rep["ptx_embedded"] is True and rep["arch"] == "sm_80"


# ------------------------------------------------------------------ the roofline

def test_roofline_names_a_real_bound():
    """From the target file's figures: compulsory DRAM bytes at HBM bandwidth vs FLOPs at peak."""
    fc = workload("matmul", preset="resnet50.fc", batch=256, dtype="float16")  # 256 x 2048 x 1000
    r = cuda.roofline(SM80, fc, 1e-3)
    nbytes = (256 * 2048 + 2048 * 1000 + 256 * 1000) * 2
    assert r["dram_bytes"] == nbytes
    t_dram, t_compute = nbytes / 1555e9, 2 * 256 * 2048 * 1000 / SM80.peak_flops("float16")
    assert r["bound"] == "DRAM" and r["roofline_seconds"] == pytest.approx(t_dram) and t_dram > t_compute
    assert r["percent_of_roofline"] == pytest.approx(100 * t_dram / 1e-3)
    # res2_3x3 at batch 32: 287 FLOP/B, above the A100's ridge (312 T / 1.555 TB/s = 201 FLOP/B) and
    # just below the H100's (989 T / 3.35 TB/s = 295 FLOP/B): compute-bound on one, DRAM-bound on the other
    conv = workload("conv2d", preset="resnet50.res2_3x3", batch=32, dtype="float16")
    a, h = cuda.roofline(SM80, conv, 1e-3), cuda.roofline(SM90, conv, 1e-3)
    assert a["arithmetic_intensity"] == pytest.approx(287.18, rel=1e-3) == h["arithmetic_intensity"]
    assert (a["bound"], h["bound"]) == ("compute", "DRAM")


def test_run_report_prints_the_bound_not_a_question_mark(capsys):
    """`run` on cuda: the report a GPU run makes (timing faked: no GPU here) names its bound."""
    from opcompiler.api import run_op
    from opcompiler.backend import RunResult
    from opcompiler.cli.basic import print_report
    from opcompiler.ops import get_op

    class Timed(CudaBackend):  # the real build; the run replaced by the reference and a fixed time
        def run(self, kernel, inputs):
            out = get_op(kernel.workload.op).reference(kernel.workload, inputs)
            return RunResult(outputs=[out], seconds=2e-6, metrics=cuda.cuda_metrics(self.target, kernel.workload, 2e-6))
    rep = run_op("matmul", SM80, shape="m=32,k=64,n=48", dtype="float16", backend=Timed(SM80))
    assert rep["bound"] in ("compute", "DRAM", "L2") and rep["cuda_compiler"] == cc.cuda_compiler()
    print_report(rep)
    out = capsys.readouterr().out
    assert f"bound by {rep['bound']}" in out and "bound by ?" not in out


# ------------------------------------------------------------------ on a GPU

gpu = pytest.mark.skipif(not has_gpu(), reason="no CUDA GPU on this machine (tvm.cuda(0).exist is False)")


@gpu
@pytest.mark.gpu
def test_cuda_is_the_gpu_present_and_older_targets_load_through_ptx():
    from opcompiler.api import run_op
    cuda.resolve_auto_target.cache_clear()
    dev = cuda.device_arch()
    t = load_target("cuda")
    assert cc.arch_number(t.extra["arch"]) <= cc.arch_number(dev)
    rep = run_op("matmul", "cuda", shape="m=64,k=64,n=64", dtype="float16")
    assert rep["correct"] and rep["bound"] in ("compute", "DRAM", "L2") and rep["device_arch"] == dev
    if cc.arch_number(dev) > 80:  # an sm_80 module on a newer GPU: its PTX is JIT-compiled there
        rep = run_op("matmul", SM80, shape="m=64,k=64,n=64", dtype="float16")
        assert rep["correct"] and rep["loaded_as"].startswith("ptx jit")
