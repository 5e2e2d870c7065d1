"""Shell completion (`dpu completion bash|zsh`, dpu/completion.py) and the manual page
(docs/dpu.1, written by tools/gen_manpage.py), both generated from the argparse parser
(issue 30): the script is valid bash and completes what the parser has; the committed page
is what the parser gives now, and man renders it.
"""
import os
import shutil
import subprocess
import sys

import pytest

from dpu.cli import _parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "dpu.1")


def commands():
    sub = next(a for a in _parser()._actions if isinstance(getattr(a, "choices", None), dict))
    return list(sub.choices)


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory):
    r = subprocess.run([sys.executable, "-m", "dpu.cli", "completion", "bash"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    path = tmp_path_factory.mktemp("completion") / "dpu.bash"
    path.write_text(r.stdout)
    return path


def complete(script, *words: str) -> list:
    """What bash offers for `dpu WORDS...` (the last word is the one being completed)."""
    line = " ".join(f"'{w}'" for w in ("dpu",) + words)
    code = (f"source '{script}'; COMP_WORDS=({line}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); _dpu; "
            "printf '%s\\n' \"${COMPREPLY[@]}\"")
    r = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return [w for w in r.stdout.split("\n") if w]


def test_the_bash_script_is_valid_bash(bash_script):
    r = subprocess.run(["bash", "-n", str(bash_script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "complete -F _dpu dpu" in bash_script.read_text()


def test_it_completes_the_command_names(bash_script):
    assert complete(bash_script, "") == commands()
    assert complete(bash_script, "dump-") == ["dump-flows", "dump-groups", "dump-megaflows"]
    assert complete(bash_script, "--log-level", "debug", "st") == ["stats"]  # a global option's value skipped


def test_it_completes_options_choices_and_files(bash_script, tmp_path):
    assert complete(bash_script, "--log-level", "") == ["debug", "info", "warning", "error"]
    assert complete(bash_script, "ct", "") == ["dump", "flush"]
    assert complete(bash_script, "completion", "") == ["bash", "zsh"]
    assert complete(bash_script, "stats", "--j") == ["--json"]
    assert set(complete(bash_script, "dump-flows", "--")) == {"--help", "--strict", "--json", "--ctl", "--log-level",
                                                               "--log-format"}
    assert complete(bash_script, "run", "--workers", "") == []  # a number: nothing to offer
    (tmp_path / "topo.yaml").write_text("")
    assert complete(bash_script, "compile", str(tmp_path / "to")) == [str(tmp_path / "topo.yaml")]


def test_zsh_script_is_valid_zsh():
    r = subprocess.run([sys.executable, "-m", "dpu.cli", "completion", "zsh"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0 and "bashcompinit" in r.stdout and "complete -F _dpu dpu" in r.stdout
    if not shutil.which("zsh"):
        pytest.skip("zsh is not installed (apt-get install zsh; tools/system_deps.py): the zsh script is not checked")
    z = subprocess.run(["zsh", "-n"], input=r.stdout, capture_output=True, text=True, timeout=60)
    assert z.returncode == 0, z.stderr


def test_an_unknown_shell_is_a_usage_error():
    r = subprocess.run([sys.executable, "-m", "dpu.cli", "completion", "fish"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 2 and "invalid choice: 'fish'" in r.stderr


def test_the_committed_man_page_is_current():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_manpage.py"), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_man_renders_the_page():
    if not shutil.which("man") or not shutil.which("groff"):
        pytest.skip("man and groff are not installed (apt-get install man-db groff; tools/system_deps.py): "
                    "docs/dpu.1 is not rendered")
    r = subprocess.run(["man", "-l", PAGE], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "MANPAGER": "cat", "MANWIDTH": "100"})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    text = r.stdout
    for heading in ("NAME", "SYNOPSIS", "GLOBAL OPTIONS", "COMMANDS", "ENVIRONMENT", "EXIT STATUS"):
        assert f"\n{heading}\n" in text, heading
    for name in commands():
        assert f"\n   {name}\n" in text, name
    assert "--log-format {text,json}" in text and "--io BACKEND" in text
    w = subprocess.run(["groff", "-man", "-ww", "-z", PAGE], capture_output=True, text=True, timeout=120)
    assert w.returncode == 0 and w.stderr == "", w.stderr
