import argparse

import pytest

from lynx_npu.eval import sweep_cmd
from lynx_npu.eval.sweep_plot import plot_sweep


def _args(*argv):
    parser = argparse.ArgumentParser()
    sweep_cmd.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_default_plan_sweeps_every_parameter_around_the_default_config():
    base, plan = sweep_cmd.sweep_plan(_args())
    assert base == {}
    assert plan["alpha_k"] == [0.125, 0.25, 0.5, 1, 2, 3, 5, 8, 16, 32, 64, 255] == plan["alpha_v"]
    assert plan["v_axis"] == ["channel", "token"]
    assert plan["num_sink_tokens"] == [0, 1, 2, 4, 8]
    assert plan["anchor_bits"] == [2, 3, 4, 6]
    assert plan["center"] == ["mean", "midrange"]


def test_plan_with_preset_overrides_and_subset():
    base, plan = sweep_cmd.sweep_plan(_args("--preset", "paper", "--set", "num_sink_tokens=4",
                                            "--sweep", "alpha_v", "--alpha-v", "3,255"))
    assert base == {"preset": "paper", "num_sink_tokens": 4}
    assert plan == {"alpha_v": [3, 255]}


def test_plan_errors_name_the_problem(capsys):
    with pytest.raises(SystemExit):  # refused by argparse, before the sweep starts
        _args("--sweep", "zeta")
    assert "--sweep: unknown swept parameter 'zeta'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="anchor_bits"):
        sweep_cmd.sweep_plan(_args("--sweep", "anchor_bits", "--anchor-bits", "1"))
    with pytest.raises(ValueError, match="key=value"):
        sweep_cmd.sweep_plan(_args("--set", "alpha_k"))


def _point(param, value, scale):
    stage = lambda e, b: {"bits_per_value": b, "attn_vnmse": e, "attn_vnmse_k_only": e / 3,  # noqa: E731
                          "attn_vnmse_v_only": e / 2, "k_nmse": e, "v_nmse": e}
    return {"param": param, "value": value, "anchor": stage(1e-2 * scale, 5.2),
            "full": stage(1e-4 * scale, 9.2)}


def test_plot_writes_a_png_with_one_panel_per_parameter(tmp_path):
    report = {"model": "m", "tokens": 64, "queries": 16, "layers": [0, 1],
              "points": [_point("alpha_k", a, a) for a in (1, 3, 255)]
              + [_point("v_axis", v, i + 1) for i, v in enumerate(("channel", "token"))]
              + [_point("num_sink_tokens", s, s + 1) for s in (0, 4)]}
    out = tmp_path / "sub" / "sweep.png"
    plot_sweep(report, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from matplotlib.image import imread

    h, w = imread(str(out)).shape[:2]
    assert w > 2.5 * h  # three panels side by side


def test_table_lists_every_point():
    report = {"model": "m", "tokens": 64, "base": {"alpha_k": 3},
              "points": [_point("alpha_k", 1, 1), _point("alpha_k", 3, 2)]}
    lines = sweep_cmd.format_sweep_table(report).splitlines()
    assert len(lines) == 4 and lines[2].startswith("alpha_k=1") and "5.200" in lines[2]
