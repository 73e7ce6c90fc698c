"""The Ascend C Lynx kernels run on the CPU through their g++ host build (no NPU involved).

``ascend_c/host_emu`` implements the subset of the Ascend C API the kernels in
``ascend_c/kernels`` use (:data:`ASCEND_C_DIR`: the checkout's ``ascend_c/``, or
``lynx_npu/ascend_c`` in an installed wheel); g++ compiles kernels + emulation into a shared
library on first use (cached by source hash under ``$LYNX_ASCEND_C_CACHE`` or
``~/.cache/lynx_npu/ascend_c_host``), and this module calls it through ctypes. The buffers
are the wire format v1 bytes of :class:`lynx_npu.codec.lynx.LynxCodec` (``EncodedLynx.anchor``
/ ``.residual``: every page's buffer back to back).

This is how CI checks the kernels against the reference codec. It is not hardware validation:
the NPU path (CANN build, torch_npu op) has not run on an Atlas device here. It is also slow
(the emulation checks every API rule per element); use it for tests, not for throughput.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass

import torch

from ..codec import lynx_tables
from ..codec.base import validate_kv
from ..codec.lynx_config import LynxConfig, make_config


def _ascend_c_dir() -> pathlib.Path:
    """The ascend_c/ sources: lynx_npu/ascend_c in an installed wheel (package data, setup.py),
    else the checkout's top-level ascend_c/ (a source tree or an editable install)."""
    package = pathlib.Path(__file__).resolve().parents[1]
    for root in (package / "ascend_c", package.parent / "ascend_c"):
        if (root / "kernels").is_dir():
            return root
    return package / "ascend_c"  # neither: _sources() says so


ASCEND_C_DIR = _ascend_c_dir()
TABLE_SIZE = 128          # LYNX_TABLE_SIZE in ascend_c/kernels/lynx_tiling.h
SIGMA_TABLE_SIZE = 256    # LYNX_SIGMA_TABLE_SIZE: the byte grid's sigma levels
DEFAULT_BLOCK_DIM = 8     # emulated AI Vector cores (an Atlas 800I A2 910B has 40 / 48)
_DTYPES = {torch.float16: 0, torch.bfloat16: 1}
_AXES = {"channel": 0, "token": 1}
_CENTERS = {"mean": 0, "midrange": 1}   # LynxCenter in ascend_c/kernels/lynx_tiling.h
_GRIDS = {"float16": 0, "byte": 1}      # LynxScalarGrid (LynxConfig.scalar_grid)
_MODE_COMPRESS, _MODE_DECOMPRESS, _MODE_PAGED = 0, 1, 2
_FLAGS = ["-std=c++17", "-O2", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math",
          "-DLYNX_HOST_EMU=1"]


class AscendCHostError(RuntimeError):
    """The host build failed, or the emulated kernel broke an Ascend C rule."""


# -- build ------------------------------------------------------------------------------------

def _sources() -> list[pathlib.Path]:
    if not ASCEND_C_DIR.is_dir():
        raise AscendCHostError(f"Ascend C sources not found at {ASCEND_C_DIR} (an install "
                               "without lynx_npu's package data)")
    return sorted(p for sub in ("kernels", "host", "host_emu") for p in (ASCEND_C_DIR / sub).iterdir()
                  if p.suffix in (".h", ".cpp"))


def _compiler() -> str:
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise AscendCHostError(f"C++ compiler {cxx!r} not found (set CXX)")
    return cxx


def _cache_dir() -> pathlib.Path:
    root = os.environ.get("LYNX_ASCEND_C_CACHE")
    return pathlib.Path(root) if root else pathlib.Path.home() / ".cache" / "lynx_npu" / "ascend_c_host"


def _target(name: str) -> tuple[pathlib.Path, list[str]]:
    """Output path (keyed by a hash of compiler, flags and sources) and g++ command of a target:
    "kernels1" / "kernels2" (the kernels with BUFFER_NUM = 1 / 2 on the emulated API) or
    "schema" (torch.ops.lynx_ascend schema + Meta implementations, against this PyTorch)."""
    cxx = _compiler()
    host = ASCEND_C_DIR / "host"
    if name == "schema":
        from torch.utils import cpp_extension

        lib_dir = pathlib.Path(torch.__file__).parent / "lib"
        abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
        args = ["-std=c++17", "-O1", "-fPIC", "-shared", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
                *(f"-I{p}" for p in cpp_extension.include_paths()), f"-I{host}",
                str(host / "lynx_op_schema.cpp"), str(host / "lynx_tiling_host.cpp"),
                f"-L{lib_dir}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib_dir}"]
        extra = torch.__version__
    else:
        buffer_num = int(name[-1])
        args = [*_FLAGS, f"-DLYNX_BUFFER_NUM={buffer_num}", f"-I{ASCEND_C_DIR / 'host_emu'}",
                f"-I{ASCEND_C_DIR / 'kernels'}", str(ASCEND_C_DIR / "host_emu" / "lynx_host_lib.cpp"),
                str(host / "lynx_tiling_host.cpp")]
        extra = ""
    h = hashlib.sha256()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    for part in [cxx, version, extra, *args]:
        h.update(part.encode())
    for src in _sources():
        h.update(src.name.encode())
        h.update(src.read_bytes())
    return _cache_dir() / h.hexdigest()[:16] / f"liblynx_ascend_{name}.so", [cxx, *args]


def _start_build(name: str) -> tuple[pathlib.Path, subprocess.Popen | None, str]:
    out, cmd = _target(name)
    if out.exists():
        return out, None, ""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so.tmp")
    os.close(fd)
    proc = subprocess.Popen([*cmd, "-o", tmp], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return out, proc, tmp


def _finish_build(out: pathlib.Path, proc: subprocess.Popen | None, tmp: str) -> None:
    if proc is None:
        return
    log, _ = proc.communicate()
    if proc.returncode != 0:
        os.unlink(tmp)
        raise AscendCHostError(f"g++ host build of ascend_c failed:\n{log}")
    os.replace(tmp, out)  # atomic: a concurrent build of the same sources writes the same file


_LIBS: dict[int, ctypes.CDLL] = {}
_SCHEMA: list[pathlib.Path] = []
_LOCK = threading.Lock()


def build(buffer_nums: tuple[int, ...] = (2,), schema: bool = False) -> None:
    """Compiles the requested kernel variants (and the op schema library) in parallel, unless cached."""
    with _LOCK:
        names = [f"kernels{n}" for n in buffer_nums if n not in _LIBS]
        if schema and not _SCHEMA:
            names.append("schema")
        jobs = [(name, *_start_build(name)) for name in names]
        for name, out, proc, tmp in jobs:
            _finish_build(out, proc, tmp)
            if name == "schema":
                torch.ops.load_library(str(out))
                _SCHEMA.append(out)
            else:
                _LIBS[int(name[-1])] = _load(out)


def load_op_schema() -> None:
    """Registers torch.ops.lynx_ascend.{compress, decompress, decompress_paged} with their Meta
    implementations (no NPU implementation: on a CPU tensor they raise NotImplementedError)."""
    build((), schema=True)


def _load(path: pathlib.Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    u32, u64, vp, cp = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_char_p
    lib.lynx_host_buffer_num.restype = u32
    lib.lynx_host_tiling_bytes.restype = u32
    lib.lynx_host_tiling.argtypes = [u32] * 18 + [u64, u32, vp, cp, u32]
    lib.lynx_host_tiling_summary.argtypes = [vp] + [ctypes.POINTER(u64)] * 2 + [ctypes.POINTER(u32)] * 5
    lib.lynx_host_page_kind.argtypes = [vp, u32, ctypes.POINTER(u32), ctypes.POINTER(u32),
                                        ctypes.POINTER(u64), ctypes.POINTER(u64), ctypes.POINTER(u64)]
    lib.lynx_host_compress.argtypes = [ctypes.c_int, u32, ctypes.c_int] + [vp] * 10 + [ctypes.POINTER(u32), cp, u32]
    lib.lynx_host_decompress.argtypes = [ctypes.c_int, u32, ctypes.c_int] + [vp] * 8 + [ctypes.POINTER(u32), cp, u32]
    return lib


def library(buffer_num: int = 2) -> ctypes.CDLL:
    """The compiled host library with ``BUFFER_NUM = buffer_num`` (1 or 2), built on first use."""
    if buffer_num not in (1, 2):
        raise ValueError(f"{buffer_num=} must be 1 or 2")
    if buffer_num not in _LIBS:
        build((buffer_num,))
    return _LIBS[buffer_num]


# -- tiling -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tiling:
    """LynxTiling (ascend_c/kernels/lynx_tiling.h) as computed by the host tiling function."""

    raw: ctypes.Array
    anchor_nbytes: int
    residual_nbytes: int
    num_pages: int
    num_work: int
    ub_bytes: int
    rows_per_block: int                 # rows of the pipelined block the buffers hold
    block_rows: tuple[int, int]         # rows per block of K, V (whole chunks of each)
    # K's and V's own split (LynxConfig.bits / residual_bits / y_max / bias of "k", "v")
    anchor_bits: tuple[int, int]
    residual_bits: tuple[int, int]
    y_max: tuple[int, int]
    bias: tuple[int, int]

    def page_kind(self, kind: int, lib: ctypes.CDLL) -> dict:
        """kind 0 = page 0, 1 = full pages, 2 = last page: tokens, sinks, section offsets, sizes."""
        tok, sink = ctypes.c_uint32(), ctypes.c_uint32()
        offs = (ctypes.c_uint64 * 10)()
        a, r = ctypes.c_uint64(), ctypes.c_uint64()
        lib.lynx_host_page_kind(self.raw, kind, tok, sink, offs, a, r)
        return {"num_tokens": tok.value, "num_sink": sink.value, "offsets": list(offs),
                "anchor_nbytes": a.value, "residual_nbytes": r.value}


def make_tiling(cfg: LynxConfig, num_heads: int, num_tokens: int, head_dim: int, dtype: torch.dtype, *,
                mode: int = _MODE_COMPRESS, use_residual: bool = True, block_size: int = 0,
                slot_bytes: int = 8, num_slots: int = 0, buffer_num: int = 2) -> Tiling:
    """Runs the C++ host tiling function; unsupported requests raise ValueError naming the value."""
    if dtype not in _DTYPES:
        raise ValueError(f"{dtype=} unsupported by the Ascend C kernels: float16 or bfloat16 KV")
    reason = _codec_unsupported(cfg)
    if reason:
        raise ValueError(f"Ascend C kernels cannot run this request: {reason}")
    lib = library(buffer_num)
    raw = (ctypes.c_uint8 * lib.lynx_host_tiling_bytes())()
    err = ctypes.create_string_buffer(512)
    rc = lib.lynx_host_tiling(num_heads, num_tokens, head_dim, 2, cfg.page_size, cfg.chunk("k"),
                              cfg.chunk("v"), cfg.bits("k"), cfg.bits("v"), _AXES[cfg.k_axis], _AXES[cfg.v_axis],
                              cfg.num_sink_tokens, _CENTERS[cfg.center], _GRIDS[cfg.scalar_grid], mode,
                              int(use_residual), block_size,
                              slot_bytes, num_slots, 0, raw, err, len(err))
    if rc:
        raise ValueError(f"Ascend C kernels cannot run this request: {err.value.decode()}")
    a, r = ctypes.c_uint64(), ctypes.c_uint64()
    pages, work, ub = (ctypes.c_uint32() for _ in range(3))
    rows = (ctypes.c_uint32 * 3)()  # K, V, the larger
    split = (ctypes.c_uint32 * 8)()  # anchor bits, residual bits, y_max, bias: K then V each
    lib.lynx_host_tiling_summary(raw, a, r, pages, work, ub, rows, split)
    return Tiling(raw, a.value, r.value, pages.value, work.value, ub.value, rows[2], (rows[0], rows[1]),
                  *((split[i], split[i + 1]) for i in range(0, 8, 2)))


TABLE_KINDS = ("thresholds", "split", "magnitudes", "sigma_levels")


def kernel_tables(cfg: LynxConfig, which: str, kind: str) -> torch.Tensor:
    """A kernel's lookup table for tensor ``which`` ("k" or "v"), float32:

    - "thresholds" [128] (compress): lynx_tables.thresholds padded with +inf;
    - "split" [128] (compress): the end cells' split thresholds, lynx_tables.split_thresholds
      (payload format 8), padded with +inf: h = |xf| >= split[I];
    - "magnitudes" [128] (decompress): lynx_tables.magnitudes, the decoded |x| of
      (m << r) | residual field (exactly 128 entries for every split of 8 bits);
    - "sigma_levels" [256] (compress on the byte scalar grid): lynx_tables.sigma_levels, the
      same for K and V and every config.
    """
    if kind not in TABLE_KINDS:
        raise ValueError(f"{kind=} must be one of {', '.join(map(repr, TABLE_KINDS))}")
    if kind == "sigma_levels":
        t = lynx_tables.sigma_levels()
        if t.numel() != SIGMA_TABLE_SIZE:
            raise ValueError(f"lynx_tables.sigma_levels() has {t.numel()} levels; the kernel's "
                             f"table holds {SIGMA_TABLE_SIZE}")
        return t.contiguous()
    alpha, y_max, r = cfg.alpha(which), cfg.y_max(which), cfg.residual_bits(which)
    if kind == "thresholds":
        t, fill = lynx_tables.thresholds(alpha, y_max), float("inf")
    elif kind == "split":
        t, fill = lynx_tables.split_thresholds(alpha, y_max, r), float("inf")
    else:
        t, fill = lynx_tables.magnitudes(alpha, y_max, r), 1.0
    if t.numel() > TABLE_SIZE:
        raise ValueError(f"lynx_tables {kind} of {which!r} has {t.numel()} entries; the kernel's "
                         f"table holds {TABLE_SIZE}")
    return torch.cat([t, torch.full((TABLE_SIZE - t.numel(),), fill)]).contiguous()


# -- ops --------------------------------------------------------------------------------------

def _ptr(t: torch.Tensor | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr() if t is not None else 0)


def _check(rc: int, err: ctypes.Array, what: str) -> None:
    if rc:
        raise AscendCHostError(f"{what}: {err.value.decode()}")


def _config(config: LynxConfig | None) -> LynxConfig:
    return config if config is not None else make_config()


def _codec_unsupported(cfg: LynxConfig) -> str | None:
    """Why the kernels cannot quantize with cfg's chunk scalars (centre, grid), or None."""
    if cfg.center not in _CENTERS:
        return f"center={cfg.center!r} (the kernels implement {', '.join(_CENTERS)})"
    if cfg.scalar_grid not in _GRIDS:
        return f"scalar_grid={cfg.scalar_grid!r} (the kernels implement {', '.join(_GRIDS)})"
    return None


def compress(k: torch.Tensor, v: torch.Tensor, config: LynxConfig | None = None, *,
             block_dim: int = DEFAULT_BLOCK_DIM, buffer_num: int = 2,
             reverse_blocks: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V [H, T, D] (float16 / bfloat16, CPU) -> (anchor, residual) uint8 byte streams,
    byte-compatible with ``LynxCodec(config).encode(k, v)``."""
    cfg = _config(config)
    validate_kv(k, v)
    h, t, d = k.shape
    tiling = make_tiling(cfg, h, t, d, k.dtype, mode=_MODE_COMPRESS, buffer_num=buffer_num)
    k, v = k.contiguous(), v.contiguous()
    thr = [kernel_tables(cfg, w, "thresholds") for w in "kv"]
    split = [kernel_tables(cfg, w, "split") for w in "kv"]
    sig = kernel_tables(cfg, "k", "sigma_levels") if cfg.scalar_grid == "byte" else None
    anchor = torch.zeros(tiling.anchor_nbytes, dtype=torch.uint8)
    residual = torch.zeros(tiling.residual_nbytes, dtype=torch.uint8)
    err = ctypes.create_string_buffer(1024)
    peak = ctypes.c_uint32()
    rc = library(buffer_num).lynx_host_compress(
        _DTYPES[k.dtype], min(block_dim, tiling.num_work), int(reverse_blocks), _ptr(k), _ptr(v),
        _ptr(thr[0]), _ptr(thr[1]), _ptr(split[0]), _ptr(split[1]), _ptr(sig), _ptr(anchor), _ptr(residual),
        tiling.raw, peak, err, len(err))
    _check(rc, err, "Ascend C compress (host build)")
    return anchor, residual


def _stage_residual(stage: str, residual: torch.Tensor | None) -> torch.Tensor | None:
    if stage not in ("anchor", "full"):
        raise ValueError(f"{stage=} must be 'anchor' or 'full'")
    if stage == "full" and residual is None:
        raise ValueError("stage='full' needs the residual stream")
    return residual if stage == "full" else None


def _check_stream(name: str, buf: torch.Tensor | None, expected: int) -> None:
    if buf is None:
        return
    if buf.dtype != torch.uint8 or buf.dim() != 1 or not buf.is_contiguous():
        raise ValueError(f"{name} must be a contiguous 1-D uint8 tensor, got {buf.dtype} {tuple(buf.shape)}")
    if buf.numel() != expected:
        raise ValueError(f"{name} has {buf.numel()} bytes; the layout needs {expected}")


def decompress(anchor: torch.Tensor, residual: torch.Tensor | None, shape: tuple[int, int, int],
               dtype: torch.dtype, config: LynxConfig | None = None, *, stage: str = "full",
               block_dim: int = DEFAULT_BLOCK_DIM, buffer_num: int = 2,
               reverse_blocks: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(anchor, residual) streams -> K, V [H, T, D]; stage "anchor" ignores the residual."""
    cfg = _config(config)
    residual = _stage_residual(stage, residual)
    h, t, d = shape
    tiling = make_tiling(cfg, h, t, d, dtype, mode=_MODE_DECOMPRESS, use_residual=residual is not None,
                         buffer_num=buffer_num)
    _check_stream("anchor", anchor, tiling.anchor_nbytes)
    _check_stream("residual", residual, tiling.residual_nbytes)
    k_out = torch.empty((h, t, d), dtype=dtype)
    v_out = torch.empty((h, t, d), dtype=dtype)
    _run_decompress(cfg, tiling, anchor, residual, k_out, v_out, None, dtype, block_dim, buffer_num,
                    reverse_blocks)
    return k_out, v_out


def decompress_paged(anchor: torch.Tensor, residual: torch.Tensor | None, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, slot_mapping: torch.Tensor, num_tokens: int,
                     config: LynxConfig | None = None, *, stage: str = "full",
                     block_dim: int = DEFAULT_BLOCK_DIM, buffer_num: int = 2,
                     reverse_blocks: bool = False) -> None:
    """Decompresses one layer straight into vLLM-Ascend's paged caches, in place.

    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_size] (contiguous); token t of
    the layer goes to slot ``slot_mapping[t]`` (int32 or int64; negative slots are skipped).
    """
    cfg = _config(config)
    residual = _stage_residual(stage, residual)
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.dim() != 4 or not c.is_contiguous():
            raise ValueError(f"{name} must be a contiguous [num_blocks, block_size, num_kv_heads, "
                             f"head_size] tensor, got shape {tuple(c.shape)}")
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} {k_cache.dtype} and v_cache "
                         f"{tuple(v_cache.shape)} {v_cache.dtype} differ")
    if slot_mapping.dtype not in (torch.int32, torch.int64) or slot_mapping.dim() != 1:
        raise ValueError(f"slot_mapping must be 1-D int32 or int64, got {slot_mapping.dtype} "
                         f"{tuple(slot_mapping.shape)}")
    if slot_mapping.numel() < num_tokens:
        raise ValueError(f"slot_mapping has {slot_mapping.numel()} entries for {num_tokens=}")
    nb, bs, h, d = k_cache.shape
    tiling = make_tiling(cfg, h, num_tokens, d, k_cache.dtype, mode=_MODE_PAGED,
                         use_residual=residual is not None, block_size=bs,
                         slot_bytes=slot_mapping.element_size(), num_slots=nb * bs, buffer_num=buffer_num)
    _check_stream("anchor", anchor, tiling.anchor_nbytes)
    _check_stream("residual", residual, tiling.residual_nbytes)
    _run_decompress(cfg, tiling, anchor, residual, k_cache, v_cache, slot_mapping.contiguous(),
                    k_cache.dtype, block_dim, buffer_num, reverse_blocks)


def _run_decompress(cfg, tiling, anchor, residual, k_out, v_out, slots, dtype, block_dim, buffer_num,
                    reverse_blocks) -> None:
    mags = [kernel_tables(cfg, w, "magnitudes") for w in "kv"]
    err = ctypes.create_string_buffer(1024)
    peak = ctypes.c_uint32()
    rc = library(buffer_num).lynx_host_decompress(
        _DTYPES[dtype], min(block_dim, tiling.num_work), int(reverse_blocks), _ptr(anchor), _ptr(residual),
        _ptr(mags[0]), _ptr(mags[1]), _ptr(k_out), _ptr(v_out), _ptr(slots), tiling.raw, peak, err, len(err))
    _check(rc, err, "Ascend C decompress (host build)")


# -- lynx_npu.ops backend adapter ---------------------------------------------------------------

class AscendCBackend:
    """A lynx_npu.ops backend (``supports`` / ``compress`` / ``decompress``, see
    ops/torch_backend.py) over the Ascend C kernels. ``kernels`` is the NPU build
    (torch.ops.lynx_ascend, NPU tensors) or the host build (this module, CPU tensors): the same
    kernel sources behind the same calls, so the CPU tests of this adapter cover the NPU path's
    Python side too."""

    name = "ascend_c"

    def __init__(self, kernels):
        self._kernels = kernels

    def supports(self, cfg: LynxConfig, num_kv_heads: int, head_dim: int, dtype) -> str | None:
        reason = _codec_unsupported(cfg)
        if reason:
            return reason
        # the largest page (sinks + a full body page) bounds the tiling's Unified Buffer plan
        return self._kernels.check(cfg, num_kv_heads, cfg.num_sink_tokens + cfg.page_size, head_dim, dtype)

    def compress(self, k: torch.Tensor, v: torch.Tensor, plan):
        return self._kernels.compress(k, v, plan.config)

    def decompress(self, anchor: torch.Tensor, residual: torch.Tensor | None, plan, dest) -> None:
        from .dest import scatter_tokens

        cfg = plan.config
        if plan.token_offset:
            # one page buffer on its own (a page after page 0): laid out exactly like a layer of
            # that page's tokens without sinks
            cfg = cfg.replace(num_sink_tokens=0)
        h, t, d = plan.num_kv_heads, plan.num_tokens, plan.head_dim
        stage = "anchor" if residual is None else "full"
        if dest.slot_mapping is not None and _is_vllm_ascend_cache(dest, h, d):
            self._kernels.decompress_paged(anchor, residual, dest.k.tensor, dest.v.tensor, dest.slot_mapping, t,
                                           cfg, stage=stage)
            return
        k, v = self._kernels.decompress(anchor, residual, (h, t, d), plan.dtype, cfg, stage=stage)
        scatter_tokens(dest, 0, k, v, h, d)


def _is_vllm_ascend_cache(dest, num_kv_heads: int, head_dim: int) -> bool:
    """True when K and V are vLLM-Ascend's separate dense [num_blocks, block_size, H, D] caches,
    the layout the paged kernel writes."""
    row = num_kv_heads * head_dim
    for tgt in (dest.k, dest.v):
        x = tgt.tensor
        if x.dim() != 4 or not x.is_contiguous() or tuple(x.shape[1:]) != (dest.block_size, num_kv_heads, head_dim):
            return False
        if (tgt.offset, tgt.s_block, tgt.s_token, tgt.s_head, tgt.s_dim) != (0, dest.block_size * row, row,
                                                                              head_dim, 1):
            return False
    return dest.k.tensor.data_ptr() != dest.v.tensor.data_ptr()


class _HostKernels:
    """The g++ host build (CPU tensors)."""

    @staticmethod
    def check(cfg, num_kv_heads, num_tokens, head_dim, dtype) -> str | None:
        try:
            make_tiling(cfg, num_kv_heads, num_tokens, head_dim, dtype)
        except ValueError as e:
            return str(e)
        return None

    compress = staticmethod(compress)
    decompress = staticmethod(decompress)
    decompress_paged = staticmethod(decompress_paged)


class _NpuKernels:
    """The CANN build: torch.ops.lynx_ascend from liblynx_ascend_ops.so (ascend_c/README.md)."""

    def __init__(self, library_path: str):
        torch.ops.load_library(library_path)
        self.ops = torch.ops.lynx_ascend
        self._tables: dict = {}

    @staticmethod
    def _args(cfg: LynxConfig) -> tuple[int, ...]:
        """The codec arguments every op takes (compress also takes the centre and the scalar
        grid: _compress_args)."""
        return (cfg.page_size, cfg.chunk("k"), cfg.chunk("v"), cfg.bits("k"), cfg.bits("v"), _AXES[cfg.k_axis],
                _AXES[cfg.v_axis], cfg.num_sink_tokens)

    @classmethod
    def _compress_args(cls, cfg: LynxConfig) -> tuple[int, ...]:
        return (*cls._args(cfg), _CENTERS[cfg.center], _GRIDS[cfg.scalar_grid])

    def _table_pair(self, cfg: LynxConfig, kind: str, device) -> list[torch.Tensor]:
        key = (cfg.alpha_k, cfg.alpha_v, cfg.anchor_bits, cfg.v_anchor_bits, kind, str(device))
        if key not in self._tables:
            self._tables[key] = [kernel_tables(cfg, w, kind).to(device) for w in "kv"]
        return self._tables[key]

    def _sigma_levels(self, cfg: LynxConfig, device) -> torch.Tensor | None:
        """The compress op's sigma level table: on the byte scalar grid only (None otherwise)."""
        if cfg.scalar_grid != "byte":
            return None
        key = ("sigma_levels", str(device))
        if key not in self._tables:
            self._tables[key] = kernel_tables(cfg, "k", "sigma_levels").to(device)
        return self._tables[key]

    def check(self, cfg, num_kv_heads, num_tokens, head_dim, dtype) -> str | None:
        if dtype not in _DTYPES:
            return f"{dtype=} unsupported by the Ascend C kernels: float16 or bfloat16 KV"
        x = torch.empty(num_kv_heads, num_tokens, head_dim, dtype=dtype, device="meta")
        t = torch.empty(TABLE_SIZE, device="meta")
        sig = self._sigma_levels(cfg, "meta")
        try:  # the Meta implementation runs the same host tiling as the NPU one
            self.ops.compress(x, x, t, t, t, t, sig, *self._compress_args(cfg))
        except RuntimeError as e:
            return str(e)
        return None

    def compress(self, k, v, config):
        thr = self._table_pair(config, "thresholds", k.device)
        split = self._table_pair(config, "split", k.device)
        sig = self._sigma_levels(config, k.device)
        return self.ops.compress(k, v, *thr, *split, sig, *self._compress_args(config))

    def decompress(self, anchor, residual, shape, dtype, config, *, stage="full"):
        mags = self._table_pair(config, "magnitudes", anchor.device)
        residual = _stage_residual(stage, residual)
        return self.ops.decompress(anchor, residual, *mags, *shape, dtype == torch.bfloat16, *self._args(config))

    def decompress_paged(self, anchor, residual, k_cache, v_cache, slot_mapping, num_tokens, config, *,
                         stage="full"):
        mags = self._table_pair(config, "magnitudes", anchor.device)
        residual = _stage_residual(stage, residual)
        self.ops.decompress_paged(anchor, residual, *mags, k_cache, v_cache, slot_mapping, num_tokens,
                                  *self._args(config))


def host_backend() -> AscendCBackend:
    """The kernels' g++ host build as an ops backend for CPU tensors (slow; for tests)."""
    return AscendCBackend(_HostKernels())


def npu_backend() -> AscendCBackend:
    """The CANN-built kernels as the ``ascend_c`` ops backend for NPU tensors.

    Raises BackendUnavailable (with the reason) without torch_npu or without the built operator
    library: ``$LYNX_ASCEND_OPS_LIB``, else ``ascend_c/out/liblynx_ascend_ops.so`` (under
    :data:`ASCEND_C_DIR`, where ``build_npu.sh`` puts it).
    """
    import importlib.util

    from .backends import BackendUnavailable

    if importlib.util.find_spec("torch_npu") is None:
        raise BackendUnavailable("torch_npu is not installed (no Ascend NPU stack on this host)")
    lib = os.environ.get("LYNX_ASCEND_OPS_LIB") or str(ASCEND_C_DIR / "out" / "liblynx_ascend_ops.so")
    if not os.path.exists(lib):
        raise BackendUnavailable(f"the Ascend C Lynx op library {lib} is not built: run "
                                 f"{ASCEND_C_DIR / 'build_npu.sh'} with CANN, or set "
                                 "LYNX_ASCEND_OPS_LIB")
    import torch_npu  # noqa: F401  (registers the NPU device before the op library loads)

    return AscendCBackend(_NpuKernels(lib))
