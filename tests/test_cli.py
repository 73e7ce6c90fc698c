import subprocess
import sys


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
