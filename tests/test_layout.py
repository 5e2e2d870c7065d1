"""The layout rules of the tests and of the dpu package, read from the sources with ast.

Tests: a test module imports no other test module (what tests share lives in
tests/helpers, see its __init__); neither do the helpers and the labs; the tests
directory goes on sys.path in conftest.py only (a child interpreter gets it through
PYTHONPATH). dpu: no two of its modules import each other, counting the imports
made inside functions (a circle held together by a lazy import is still a circle).
"""
import ast
import os
import re
import shutil
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
DPU = os.path.join(ROOT, "dpu")
LABS = {"netns", "livelab", "live_peer", "evpn_lab", "ovs_oracle"}


def _files(top: str, suffixes=(".py",)):
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for f in sorted(filenames):
            if f.endswith(suffixes):
                yield os.path.join(dirpath, f)


def _tree(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), path)


def _imported(tree: ast.Module, package: str = ""):
    """(line, absolute module name) of every import in the tree, in functions too;
    relative imports resolved against ``package``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            yield node.lineno, mod
            for a in node.names:  # `from pkg import module`
                yield node.lineno, f"{mod}.{a.name}"


def _is_test_module(name: str) -> bool:
    last = name.split(".")[-1]
    return last.startswith("test_") or last == "conftest"


def _rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


def test_the_rules_are_checked_on_real_files():
    files = [os.path.basename(p) for p in _files(TESTS)]
    assert "conftest.py" in files and "test_layout.py" in files and len(files) > 40
    assert os.path.isfile(os.path.join(TESTS, "helpers", "__init__.py"))


def test_no_test_module_imports_another():
    bad = []
    for path in _files(TESTS):
        for line, name in _imported(_tree(path), "helpers" if "/helpers/" in path else ""):
            if _is_test_module(name):
                bad.append(f"{_rel(path)}:{line}: imports {name}")
    assert not bad, "move what they share into tests/helpers:\n" + "\n".join(bad)


def test_top_of_tests_holds_tests_labs_and_conftest_only():
    stray = [f for f in os.listdir(TESTS) if f.endswith(".py") and not f.startswith("test_")
             and f != "conftest.py" and f[:-3] not in LABS]
    assert not stray, f"shared code belongs in tests/helpers: {stray}"
    in_helpers = [os.path.basename(p) for p in _files(os.path.join(TESTS, "helpers"))]
    assert not [f for f in in_helpers if f.startswith("test_")], in_helpers


_SYS_PATH = re.compile(r"sys\.path\.(insert|append|extend)|sys\.path\s*(\+=|=)")


def test_sys_path_is_set_in_conftest_only():
    """In code and in the code strings given to child interpreters alike."""
    bad = []
    for path in _files(TESTS):
        if os.path.basename(path) in ("conftest.py", "test_layout.py"):
            continue
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if _SYS_PATH.search(line):
                    bad.append(f"{_rel(path)}:{n}: {line.strip()}")
    assert not bad, "the tests directory goes on sys.path in conftest.py only:\n" + "\n".join(bad)


def _dpu_modules():
    """{module name: path} of the dpu package, subpackages included."""
    out = {}
    for path in _files(DPU):
        rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return out


def _dpu_graph():
    mods = _dpu_modules()
    graph = {}
    for name, path in mods.items():
        package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
        deps = set()
        for _, imp in _imported(_tree(path), package):
            # the longest dpu module the import names (dpu.topology.schema, not dpu)
            while imp and imp not in mods:
                imp = imp.rsplit(".", 1)[0] if "." in imp else ""
            if imp and imp != name and not name.startswith(imp + "."):  # a package's own parent is no edge
                deps.add(imp)
        graph[name] = deps
    return graph


def _cycles(graph):
    """Every strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_dpu_has_no_import_cycle():
    graph = _dpu_graph()
    assert "dpu.control" in graph and "dpu.live" in graph and "dpu.topology.schema" in graph
    assert "dpu.control" in graph["dpu.live"]   # live serves the control socket ...
    assert "dpu.live" not in graph["dpu.control"]   # ... and control does not reach back
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_lazy_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    tree = ast.parse("def f():\n    from .live import x\n")
    assert ("dpu.live" in {m for _, m in _imported(tree, "dpu")})


@pytest.mark.parametrize("name", ["test_x", "pkg.test_x", "conftest"])
def test_a_test_module_is_recognised(name):
    assert _is_test_module(name)


@pytest.mark.parametrize("tool", ["fnlen.py", "includes.py"])
def test_functions_are_short_and_stages_do_not_see_the_dataplane(tool):
    """tools/fnlen.py: no function over 150 lines (argparse tables excepted); tools/includes.py:
    no stage of the worker includes dataplane.h, directly or through another header."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", tool)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def _tree_copy(tmp_path, *tops):
    """A copy of tools/ and of the given folders, where a tool reads the copy (its root is
    the folder above its own)."""
    for top in ("tools",) + tops:
        shutil.copytree(os.path.join(ROOT, top), tmp_path / top, ignore=shutil.ignore_patterns("build", "*.so"))
    return tmp_path


def _tool(root, tool):
    return subprocess.run([sys.executable, str(root / "tools" / tool)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("where, header", [
    ("stage.h", "tunnel_term.h"),               # a header next to the stages
    ("worker.h", "conntrack/conn.h"),           # one in a folder, included from its neighbour there
])
def test_includes_finds_dataplane_h_behind_another_header(tmp_path, where, header):
    root = _tree_copy(tmp_path, "native")
    h = root / "native" / "src" / header
    up = "../" * header.count("/")
    h.write_text(h.read_text().replace("#pragma once", f'#pragma once\n#include "{up}dataplane.h"', 1))
    r = _tool(root, "includes.py")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{where} reaches dataplane.h: " in r.stderr and f"{header} -> dataplane.h" in r.stderr, r.stderr


def test_fnlen_finds_a_long_function_of_each_language(tmp_path):
    root = _tree_copy(tmp_path)
    (root / "native" / "src").mkdir(parents=True)
    (root / "dpu").mkdir()
    body = "".join(f"  x += {i};\n" for i in range(160))
    (root / "native" / "src" / "long.cc").write_text(
        "namespace dpu {\nstruct S {\n  int f() const { return 1; }\n};\n"
        f"int Long::g(int a, const char* s) const {{\n  int x = a;\n  if (s) {{ x++; }}\n{body}  return x;\n}}\n}}\n")
    (root / "dpu" / "long.py").write_text(
        "def short():\n    return 1\n\n\ndef long_one():\n" + "".join(f"    x = {i}\n" for i in range(160)))
    r = _tool(root, "fnlen.py")
    assert r.returncode == 1
    assert r.stdout.splitlines() == ["  165  native/src/long.cc:5  Long::g", "  161  dpu/long.py:5  long_one"], r.stdout


def test_native_code_prefetches_through_dpu_prefetch_only():
    """__builtin_prefetch in a helper that is not inlined early is deleted by GCC 12 (the
    helper is found pure, the call dead): dpu/mem.h's prefetch() is the one way in."""
    mem_h = os.path.join(ROOT, "native", "include", "dpu", "mem.h")
    found = []
    for path in _files(os.path.join(ROOT, "native"), (".h", ".cc", ".def")):
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                code = line.split("//", 1)[0]
                if "__builtin_prefetch" in code and path != mem_h:
                    found.append(f"{_rel(path)}:{n}")
    assert not found, "use dpu::prefetch / dpu::prefetch_w (dpu/mem.h): " + ", ".join(found)


PREFETCH_HELPER = """
#include "dpu/mem.h"
struct Table {
  char* base;
  [[gnu::noinline]] void warm(unsigned h) const { dpu::prefetch(base + (h & 1023u) * 256u); }
};
unsigned hash_all(const Table& t, const unsigned* keys, unsigned* out, int n) {
  unsigned acc = 0;
  for (int i = 0; i < n; i++) { out[i] = keys[i] * 2654435761u; t.warm(out[i]); acc ^= out[i]; }
  return acc;
}
"""


def test_a_prefetch_in_an_out_of_line_helper_survives_optimisation(tmp_path):
    """The shape that lost the exact-match cache's prefetch: a helper whose only effect is a
    prefetch, called where it is not inlined. With dpu::prefetch, -O3 keeps the call and the
    prefetch instruction (with __builtin_prefetch, GCC 12 deletes both)."""
    cxx = shutil.which("g++") or shutil.which("c++")
    objdump = shutil.which("objdump")
    if not cxx or not objdump or os.uname().machine != "x86_64":
        pytest.skip("needs g++ and objdump on x86-64")
    src = tmp_path / "helper.cc"
    src.write_text(PREFETCH_HELPER)
    obj = tmp_path / "helper.o"
    subprocess.run([cxx, "-O3", "-std=c++17", "-I", os.path.join(ROOT, "native", "include"), "-c", str(src), "-o",
                    str(obj)], check=True, capture_output=True, timeout=120)
    asm = subprocess.run([objdump, "-d", str(obj)], check=True, capture_output=True, text=True).stdout
    assert re.search(r"\bprefetcht0\b", asm), asm
    assert re.search(r"\bcall\b.*warm", asm), asm
