import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
DATA = pathlib.Path(os.environ.get("LYNX_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def data_dir() -> pathlib.Path:
    if not DATA.is_dir():
        pytest.skip(f"real data not found at {DATA} (set LYNX_DATA)")
    return DATA
