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


def pytest_terminal_summary(terminalreporter):
    """CI keeps only the tail of a run's output, where a failure's own stderr (a vLLM engine
    process prints its root cause there) is cut: repeat the end of it after the summary."""
    reports = [r for key in ("failed", "error") for r in terminalreporter.stats.get(key, [])]
    for rep in [r for r in reports if any("stderr" in name for name, _ in r.sections)][:3]:
        err = "".join(text for name, text in rep.sections if "stderr" in name)
        terminalreporter.write_sep("-", f"end of the stderr of {rep.nodeid} ({rep.when})")
        terminalreporter.write_line("\n".join(err.rstrip().splitlines()[-25:]))
