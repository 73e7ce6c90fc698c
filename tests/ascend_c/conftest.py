"""Fixtures for the Ascend C kernel tests (host g++ build; no NPU here).

Every test in this directory carries the ``ascend_c`` marker, so ``pytest -m ascend_c`` selects
exactly them. The marker is registered here too, in case the root configuration does not.
"""
import pathlib
import shutil

import pytest

ASCEND_C_MARKER = "ascend_c: Ascend C kernels through the host (g++) build of the Ascend C API subset"


def pytest_configure(config):
    config.addinivalue_line("markers", ASCEND_C_MARKER)


HERE = pathlib.Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in pathlib.Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.ascend_c)


@pytest.fixture(scope="session")
def host_build():
    """Compiles both kernel variants (BUFFER_NUM = 2 and 1) and the op schema library once, in parallel."""
    from lynx_npu.ops import ascend_c_host

    if shutil.which("g++") is None:
        pytest.skip("no C++ compiler (g++) to build the Ascend C kernels for the host")
    ascend_c_host.build((2, 1), schema=True)
    return ascend_c_host
