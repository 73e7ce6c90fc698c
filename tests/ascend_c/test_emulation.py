"""The host emulation of the Ascend C API implements the documented semantics the kernels rely
on (reduction order, bit-mask Duplicate / Brcb / Compare / Select / Gather, cast rounding, DataCopyPad)
and refuses what a real kernel must not do (emu_rules.cpp)."""
import pathlib
import shutil
import subprocess

import pytest

from lynx_npu.ops.ascend_c_host import ASCEND_C_DIR

HERE = pathlib.Path(__file__).parent


def test_emulation_rules(tmp_path):
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++) to build the Ascend C host emulation")
    exe = tmp_path / "emu_rules"
    build = subprocess.run([cxx, "-std=c++17", "-O1", "-ffp-contract=off", "-DLYNX_HOST_EMU=1",
                            f"-I{ASCEND_C_DIR / 'host_emu'}", str(HERE / "emu_rules.cpp"), "-o", str(exe)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    lines = run.stdout.splitlines()
    assert run.returncode == 0, run.stdout + run.stderr
    assert lines[-1] == "0 failed" and sum(line.startswith("ok ") for line in lines) >= 20
