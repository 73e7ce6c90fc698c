"""Where the demo finds its prompts when no path is given (the README runs ``lynx demo`` from the
repository root with the data checkout beside it)."""
import pathlib

from lynx_npu.integration.vllm_ascend.tools import demo_data


def test_lynx_data_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("LYNX_DATA", str(tmp_path))
    assert demo_data.default_data() == tmp_path / "qmsum" / "val.jsonl"


def test_found_beside_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("LYNX_DATA", raising=False)
    (tmp_path / "shared" / "data" / "qmsum").mkdir(parents=True)
    (tmp_path / "shared" / "data" / "qmsum" / "val.jsonl").write_text("{}\n")
    (tmp_path / "repo").mkdir()
    monkeypatch.chdir(tmp_path / "repo")
    assert demo_data.default_data() == pathlib.Path.cwd().parent / "shared/data/qmsum/val.jsonl"


def test_the_checkout_root_is_the_repository(monkeypatch):
    # integration/vllm_ascend/tools/demo_data.py -> the repository root (pyproject/setup.py)
    assert (demo_data.REPO_ROOT / "setup.py").is_file()
    assert (demo_data.REPO_ROOT / "integration" / "vllm_ascend").is_dir()
