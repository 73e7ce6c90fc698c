"""A built wheel (and an sdist) carries every source the kernels build from, and an install of
it runs the compiled CPU kernel and the Ascend C host build with no checkout in sight.

The wheel is built offline from a copy of this tree (``pip wheel --no-build-isolation
--no-index``: this environment's setuptools, nothing downloaded, no ``build/`` left in the
checkout). The install goes into a fresh venv (no system site-packages) with ``--no-deps``; the
wheel's declared requirements (torch, numpy, crc32c and what they require, nothing else) are
linked into it from this environment: installing them would need the network (crc32c is not on
this machine's local index) and unpack ~1 GB of torch per run (45 s measured). The venv's
Python runs isolated (``-I``: no PYTHONPATH, no current directory), and the test checks that
lynx_npu and its sources come from the venv. ``LYNX_BACKEND=cpu`` makes a kernel that cannot
build an error, not a quiet fallback to the reference.
"""
from __future__ import annotations

import email.parser
import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[1]
# What the kernels build from, as it must appear in the wheel (relative to site-packages).
KERNEL_SOURCES = {
    **{f"lynx_npu/ops/cpu/{p.name}": p for p in (REPO / "lynx_npu/ops/cpu").iterdir()
       if p.suffix in (".cpp", ".h")},
    **{f"lynx_npu/ascend_c/{p.relative_to(REPO / 'ascend_c')}": p
       for d in ("kernels", "host", "host_emu") for p in (REPO / "ascend_c" / d).iterdir()
       if p.suffix in (".cpp", ".h")},
    **{f"lynx_npu/ascend_c/{n}": REPO / "ascend_c" / n for n in ("CMakeLists.txt", "build_npu.sh")},
}
_NOT_SOURCES = shutil.ignore_patterns(".git", ".venv*", ".deps", "build", "dist", "out",
                                      "*.egg-info", "__pycache__",
                                      ".pytest_cache", ".hypothesis", "*.so")


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _pip_wheel(src: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "-q", "-w", out, src])
    (wheel,) = out.glob("lynx_npu-*.whl")
    return wheel


def _contents(wheel: pathlib.Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as z:
        return {n: z.read(n) for n in z.namelist()}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(wheel, the copy of the tree it was built from)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=_NOT_SOURCES, symlinks=True)
    return _pip_wheel(src, tmp / "dist"), src


def test_wheel_carries_the_kernel_sources(built):
    files = _contents(built[0])
    missing = sorted(set(KERNEL_SOURCES) - set(files))
    assert not missing, f"not in the wheel: {missing}"
    for name, path in KERNEL_SOURCES.items():
        assert files[name] == path.read_bytes(), name
    top = {n.split("/")[0] for n in files}
    assert top == {"lynx_npu", "lynx_npu-0.1.0.dist-info"}, f"top-level names leak: {top}"


def test_sdist_builds_the_same_wheel(built, tmp_path):
    wheel, src = built
    _run([sys.executable, "setup.py", "-q", "sdist", "-d", tmp_path / "sdist"], cwd=src)
    (sdist,) = (tmp_path / "sdist").glob("lynx_npu-*.tar.gz")
    with tarfile.open(sdist) as t:
        t.extractall(tmp_path / "unpacked",
                     **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    again = _pip_wheel(tmp_path / "unpacked" / sdist.name[:-len(".tar.gz")], tmp_path / "dist")
    a, b = _contents(wheel), _contents(again)
    assert sorted(a) == sorted(b)
    assert [n for n in a if a[n] != b[n]] == []


def _requirements(wheel: pathlib.Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = email.parser.Parser().parsestr(z.read("lynx_npu-0.1.0.dist-info/METADATA").decode())
    return meta.get_all("Requires-Dist") or []


def _closure(requirements: list[str]) -> dict[str, metadata.Distribution]:
    """The installed distributions the requirements name, recursively (no extras)."""
    found: dict[str, metadata.Distribution] = {}
    todo = list(requirements)
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name not in found:
            found[name] = metadata.distribution(req.name)
            todo += found[name].requires or []
    return found


def _link_into(site: pathlib.Path, dists) -> None:
    """Symlinks each distribution's top-level entries (packages, modules, .libs, dist-info)."""
    for dist in dists:
        root = pathlib.Path(dist.locate_file(""))
        for top in {pathlib.PurePath(f).parts[0] for f in dist.files or ()} - {"..", "__pycache__"}:
            if (root / top).exists() and not (site / top).exists():
                (site / top).symlink_to(root / top)


SCRIPT = r"""
import json, pathlib, sys
import torch
import lynx_npu
from lynx_npu import ops
from lynx_npu.codec.lynx_config import LynxConfig
from lynx_npu.ops import ascend_c_host, cpu_backend

venv, repo = pathlib.Path(sys.prefix), pathlib.Path(sys.argv[1])
for p in (lynx_npu.__file__, cpu_backend.SOURCE, ascend_c_host.ASCEND_C_DIR):
    assert pathlib.Path(p).is_relative_to(venv), (p, venv)
leaks = [p for p in sys.path if p and pathlib.Path(p).resolve().is_relative_to(repo)]
leaks += [m.__file__ for m in list(sys.modules.values()) if getattr(m, "__file__", None)
          and pathlib.Path(m.__file__).resolve().is_relative_to(repo)]
assert not leaks, leaks

g = torch.Generator().manual_seed(0)
k = (torch.randn(3, 700, 64, generator=g) * torch.linspace(0.2, 6, 64)).to(torch.bfloat16)
v = (torch.randn(3, 700, 64, generator=g) * 0.5).to(torch.bfloat16)
cfg = LynxConfig()
assert ops.backend_for("cpu", cfg, 3, 64, torch.bfloat16) == "cpu"  # LYNX_BACKEND=cpu
a, r = ops.compress(k, v, cfg)
ta, tr = ops.compress(k, v, cfg, backend="torch")
assert torch.equal(a, ta) and torch.equal(r, tr), "cpu kernel bytes differ from the reference"
dk, dv = ops.decompress(a, r, cfg, k.shape, k.dtype)
tk, tv = ops.decompress(a, r, cfg, k.shape, k.dtype, backend="torch")
assert torch.equal(dk, tk) and torch.equal(dv, tv), "cpu kernel values differ from the reference"
ha, hr = ascend_c_host.compress(k, v, cfg)  # the Ascend C kernels' g++ host build
assert torch.equal(ha, ta) and torch.equal(hr, tr), "ascend_c host bytes differ"
print(json.dumps({"cpu": cpu_backend.build_info(), "anchor_bytes": a.numel(),
                  "ascend_c_dir": str(ascend_c_host.ASCEND_C_DIR)}))
"""


def test_installed_wheel_builds_and_runs_the_kernels(built, tmp_path):
    wheel = built[0]
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = pathlib.Path(_run([python, "-c", purelib]).stdout.strip())
    assert site.is_relative_to(venv) and sysconfig.get_path("purelib") != str(site)
    deps = _closure(_requirements(wheel))
    assert {"torch", "numpy", "crc32c"} <= set(deps)
    _link_into(site, deps.values())
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
          "-q", wheel])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LYNX_", "PYTHON"))}
    env.update(LYNX_BACKEND="cpu", LYNX_CACHE_DIR=str(tmp_path / "cache"),
               LYNX_ASCEND_C_CACHE=str(tmp_path / "ascend_c_cache"))
    out = _run([python, "-I", "-c", SCRIPT, REPO], cwd=tmp_path, env=env).stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert pathlib.Path(report["cpu"]["path"]).is_relative_to(tmp_path / "cache")
    assert pathlib.Path(report["ascend_c_dir"]) == site / "lynx_npu" / "ascend_c"
