import argparse
import shlex
import subprocess
import sys

import pytest

from lynx_npu.cli import main
from lynx_npu.cli_types import (int_in, layer_list, names, number_in, optional_output_file,
                                output_file)


def _lynx(*args):
    return subprocess.run([sys.executable, "-m", "lynx_npu.cli", *args], capture_output=True,
                          text=True, timeout=120)


def test_subcommand_help_lists_its_own_options():
    out = _lynx("bench", "transfer", "--help")
    assert out.returncode == 0 and "--gbps" in out.stdout


def test_top_level_help_and_bad_command():
    assert "demo" in _lynx("--help").stdout
    bad = _lynx("nope")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


# Issue 18 item 9: bad invocations of every command, refused before any work starts with one
# line naming the option and a non-zero exit, never a traceback. (command line, option or
# value the message must name, exit code: 2 for argparse, 1 for a ValueError the run raises
# before its work, e.g. an unknown codec spec resolved against the registry; "--data ." so
# the default data folder, relative to the working directory, need not exist)
BAD = [
    ("eval codecs --tokens 0", "--tokens", 2),
    ("eval codecs --tokens abc", "--tokens", 2),
    ("eval codecs --queries -5", "--queries", 2),
    ("eval codecs --json /nonexistent/dir/x.json", "--json", 2),
    ("eval codecs --codecs ,", "--codecs", 2),
    ("eval codecs --data . --codecs zstd", "'zstd'", 1),
    ("eval codecs --layers 3-1", "--layers", 2),
    ("eval codecs --lynx-backend gpu", "--lynx-backend", 2),
    ("eval codecs --data /nonexistent", "--data", 2),
    ("eval codecs --data . --codec-arg lynx:alpha_k=abc", "alpha_k", 1),
    ("eval sweep --sweep bogus", "--sweep", 2),
    ("eval sweep --alpha-k 1,,2", "--alpha-k", 2),
    ("eval sweep --data . --set anchor_bits=9", "anchor_bits=9", 1),
    ("eval sweep --plot /nonexistent/x.png", "--plot", 2),
    ("bench kernels --tokens 0 --repeats 0", "--tokens", 2),  # ran 8192 tokens, exit 0
    ("bench kernels --repeats 0", "--repeats", 2),
    ("bench kernels --ops compress,nope", "--ops", 2),
    ("bench kernels --backend gpu", "--backend", 2),
    ("bench kernels --preset nope", "--preset", 2),
    ("bench kernels --json /nonexistent/x.json", "--json", 2),
    ("bench kernels --paged-layout nope", "--paged-layout", 2),
    ("bench transfer --gbps inf", "--gbps", 2),
    ("bench transfer --gbps -1", "--gbps", 2),
    ("bench transfer --gbps nan", "--gbps", 2),
    ("bench transfer --connections 100", "--connections", 2),
    ("bench transfer --codec ,", "--codec", 2),                 # ran nothing, exit 0
    ("bench transfer --codec zstd", "--codec", 2),
    ("bench transfer --json /nonexistent/dir/x.json", "--json", 2),  # failed after the run
    ("bench transfer --timeout 0", "--timeout", 2),
    ("demo --gbps -1", "--gbps", 2),
    ("demo --modes lynx,zzz", "--modes", 2),
    ("demo --max-drafts 500", "--max-drafts", 2),
    ("demo --prompts 0", "--prompts", 2),
    ("demo --json /nonexistent/x.json", "--json", 2),
    ("demo --data /nonexistent.jsonl", "--data", 2),
    ("demo --model llama3", "--model", 2),
]


@pytest.mark.parametrize("line,names,code", BAD, ids=[b[0] for b in BAD])
def test_a_bad_invocation_is_one_line_naming_the_option(line, names, code, capsys):
    try:
        rc = main(shlex.split(line))
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    assert rc == code, (out.out, out.err)
    err = out.err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    prog = " ".join(line.split()[:1 if line.startswith("demo") else 2])
    assert err.startswith(f"lynx {prog}: error: ") and names in err, err
    assert out.out == ""


def test_the_console_command_prints_no_traceback(tmp_path):
    """The real process: argparse's refusal and a run-time ValueError, one line each."""
    bad = _lynx("bench", "transfer", "--gbps", "inf")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip() == ("lynx bench transfer: error: argument --gbps: 'inf' must be a "
                                  "finite number in (0, 100000] (see lynx bench transfer --help)")
    bad = _lynx("eval", "sweep", "--data", ".", "--set", "anchor_bits=9", "--json",
                str(tmp_path / "s.json"))
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == ["lynx eval sweep: error: anchor_bits=9 must be in "
                                               "[2, 7]"]
    assert not (tmp_path / "s.json").exists()


def test_output_paths_are_checked_before_work(tmp_path):
    assert output_file(str(tmp_path / "x.json")) == str(tmp_path / "x.json")
    for bad, why in ((tmp_path, "is a directory"), (tmp_path / "no" / "x.json", "does not exist"),
                     ("", "must not be empty")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            output_file(str(bad))
    assert optional_output_file("") == ""


def test_argument_types_name_their_range():
    assert int_in(1, 4)("3") == 3 and number_in(0, 1, low_open=True)("0.5") == 0.5
    assert names(["a", "b"])("a,b") == "a,b" and layer_list("0,2-5") == "0,2-5"
    for parse, text, why in ((int_in(1, 4), "5", r"\[1, 4\]"), (int_in(1, 4), "1.5", "not an int"),
                             (number_in(0, 1), "inf", "finite"), (number_in(0, 1), "x", "number"),
                             (names(["a"]), "a,", "none empty"), (names(["a"]), "b", "unknown"),
                             (layer_list, "1-x", "range"), (layer_list, "-1", "range")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            parse(text)
