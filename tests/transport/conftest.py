"""An exception escaping any transport thread fails the test that caused it."""
import pathlib

import pytest

HERE = pathlib.Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
    for item in items:
        if HERE in pathlib.Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.filterwarnings(
                "error::pytest.PytestUnhandledThreadExceptionWarning"))
