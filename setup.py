"""Build for dpu: the pybind11 core (dpu._core_v1, dpu._core_v3) and the Cython helpers (dpu._gen).

The native sources are plain C++17 (native/); only native/bindings/ sees Python headers. The
core is compiled once per x86-64 level of dpu/_cpu.py, each an extension module of its own, and
dpu/_core.py loads the best one the CPU runs (docs/development.md, "Building"):

- a wheel or an install from source (`pip install .`, `pip wheel .`, `python -m build`) holds
  every level, with its debug info moved into build/debug/ (the .so keeps a link to it);
- a build in place (`pip install -e .`, `setup.py build_ext --inplace`) runs where it is built:
  only this machine's best level, with its debug info.

Only setuptools is needed to read this file (`setup.py sdist`); building asks for pybind11,
Cython and numpy when it starts.
"""
import importlib.util
import os
import shutil
import subprocess
import sys
from glob import glob

# Run directly (`python3 setup.py ...`), this needs the build requirements in the running
# Python; pip and `python -m build` bring them into an environment of their own.
BUILD_REQUIRES = ("setuptools", "pybind11", "Cython", "numpy")


def _missing(names):
    return [m for m in names if importlib.util.find_spec(m) is None]


def _need(names, what):
    missing = _missing(names)
    if missing:
        sys.exit(f"setup.py: {', '.join(missing)} not installed in {sys.executable}, {what}: `pip install -e '.[test]'` "
                 "brings them with dpu (or build with `pip install .` / `python -m build`, which fetch them)")


if _missing(["setuptools"]):
    _need(BUILD_REQUIRES, "needed to build dpu")

from setuptools import Extension, setup  # noqa: E402
from setuptools.command.build_ext import build_ext  # noqa: E402


def _load_cpu():
    """dpu/_cpu.py (the levels and their CPU features), read by path: dpu itself is not importable yet."""
    spec = importlib.util.spec_from_file_location("_dpu_cpu", os.path.join(os.path.dirname(__file__) or ".", "dpu", "_cpu.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # NamedTuple wants its module findable
    spec.loader.exec_module(mod)
    return mod


CPU = _load_cpu()

CXXFLAGS = ["-O3", "-g", "-std=c++17", "-fno-strict-aliasing", "-fno-plt", "-Wall", "-Wextra", "-Wno-unused-parameter",
            "-fvisibility=hidden"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-wrapv"] if os.environ.get("DPU_DEBUG") else []
# DPU_QUICK_BUILD=1: -O0, no debug info and no LTO, a fraction of the compile time and a slow
# core, for what builds a wheel to check the package rather than its speed (tests/test_wheel.py).
QUICK = bool(SANITIZE or os.environ.get("DPU_QUICK_BUILD"))
QUICK_FLAGS = ["-O0", "-g"] + SANITIZE if SANITIZE else ["-O0", "-g0"]  # after Python's own -O3 -g
if QUICK:  # DPU_DEBUG=1: both extensions under ASan+UBSan (preload libasan/libubsan to run)
    CXXFLAGS = [f for f in CXXFLAGS if f not in ("-O3", "-g")] + QUICK_FLAGS
# Link-time optimisation of the core: a packet's conntrack stage calls across
# files (ct_stage.cc, conntrack.cc, ct_packet.cc, ct_tcp.cc), which only the
# linker can inline. With the batch loop's small helpers forced inline (the
# whole-program inliner left them out), every benchmark gains (8 rounds A/B
# against the same code without LTO: x1.01 to x1.07, snat-1m x1.06). The code
# is generated at link time from what each file was compiled to, for the
# instruction set it was compiled for (a -march given only to the link
# changes nothing), so the link gets the same flags. DPU_NO_LTO=1, or
# DPU_DEBUG=1 or DPU_QUICK_BUILD=1, builds without it.
LTO = [] if QUICK or os.environ.get("DPU_NO_LTO") else ["-flto=auto"]


def _afxdp():
    """Compile flags for the AF_XDP backend (native/src/ports/afxdp.cc) when pkg-config finds the
    headers of libxdp and libbpf; none otherwise, and afxdp.cc builds the stub that says how to
    get them. The libraries are not linked: the core opens them when AF_XDP is asked for
    (afxdp_lib.h). DPU_NO_AFXDP=1 builds the stub anyway."""
    if os.environ.get("DPU_NO_AFXDP"):
        return []
    try:
        r = subprocess.run(["pkg-config", "--cflags", "libxdp", "libbpf"], capture_output=True, text=True)
    except OSError:
        r = None
    if r is None or r.returncode != 0:
        return []
    return ["-DDPU_HAVE_AFXDP"] + [f for f in r.stdout.split() if f.startswith("-I")]


AFXDP_CFLAGS = _afxdp()
CORE_SOURCES = sorted(glob("native/src/*.cc")) + sorted(glob("native/src/*/*.cc")) + ["native/bindings/module.cc"]
HEADERS = sorted(glob("native/include/dpu/*")) + sorted(glob("native/src/*.h")) + sorted(glob("native/src/*/*.h"))


def _core(variant):
    """The core compiled for one level (dpu/_cpu.py) as the module dpu._core_<name>."""
    march = "native" if os.environ.get("DPU_NATIVE_ARCH") else variant.march
    isa = [f"-march={march}", "-mtune=generic"] if march != "native" else ["-march=native"]
    ident = [f"-DDPU_CORE_MODULE=_core_{variant.name}"]
    return Extension(
        f"dpu._core_{variant.name}",
        CORE_SOURCES,
        include_dirs=["native/include", "native/src"],
        language="c++",
        depends=HEADERS,
        extra_compile_args=CXXFLAGS + isa + LTO + AFXDP_CFLAGS + ident,
        # the ISA again for LTO's code generation; -ldl: dlopen of libxdp before glibc 2.34
        extra_link_args=SANITIZE + (LTO + ["-O3"] + isa if LTO else []) + (["-ldl"] if AFXDP_CFLAGS else []),
    )


# dpu/_gen.pyx is added when building (Cython turns it into C++ then): setuptools would
# otherwise rename it to a .cpp that an sdist does not have when Cython is not installed.
GEN = Extension(
    "dpu._gen",
    ["native/src/pcap.cc"],
    include_dirs=["native/include", "native/src"],
    language="c++",
    extra_compile_args=(QUICK_FLAGS if QUICK else ["-O3"]) + ["-std=c++17"],
    extra_link_args=SANITIZE,
)
GEN_PYX = "dpu/_gen.pyx"


def _variants_to_build(in_place):
    """DPU_CORE_VARIANTS=v1,v3 when set; else a wheel holds every level, a build in place only
    this machine's best (or its only one, with DPU_NATIVE_ARCH=1)."""
    asked = [v for v in os.environ.get("DPU_CORE_VARIANTS", "").replace(",", " ").split() if v]
    unknown = [v for v in asked if v not in CPU.BY_NAME]
    if unknown:
        sys.exit(f"setup.py: DPU_CORE_VARIANTS: no level {', '.join(unknown)} (levels: {', '.join(CPU.BY_NAME)})")
    if asked:
        return asked
    if in_place or os.environ.get("DPU_NATIVE_ARCH"):
        return [CPU.best(CPU.cpu_flags()).name]
    return [v.name for v in CPU.VARIANTS]


class BuildExt(build_ext):
    """build_ext with the core's levels (which to build, each in a build directory of its own,
    rebuilt when its flags change), the build requirements imported when building starts, and
    debug info kept apart from what a wheel ships."""

    def finalize_options(self):
        super().finalize_options()  # an editable install (pip install -e) sets inplace here
        self.dpu_in_place = bool(self.inplace)
        wanted = {f"dpu._core_{v}" for v in _variants_to_build(self.dpu_in_place)}
        self.extensions = [e for e in self.extensions if not e.name.startswith("dpu._core_") or e.name in wanted]

    def run(self):
        _need(BUILD_REQUIRES[1:], "needed to build the native core")
        if not AFXDP_CFLAGS and not os.environ.get("DPU_NO_AFXDP"):  # said now, not at `--io afxdp`
            print("setup.py: warning: no libxdp/libbpf headers (pkg-config libxdp libbpf found none): this build has "
                  "no AF_XDP (`dpu run --io afxdp`); install pkg-config libxdp-dev libbpf-dev (Debian) and build again",
                  file=sys.stderr)
        import numpy
        import pybind11
        from Cython.Build import cythonize
        from pybind11.setup_helpers import ParallelCompile

        ParallelCompile("DPU_BUILD_JOBS", default=os.cpu_count() or 2).install()
        for ext in self.extensions:
            if ext.name.startswith("dpu._core_"):
                ext.include_dirs.append(pybind11.get_include())
            elif ext.name == GEN.name and GEN_PYX not in ext.sources:
                (gen,) = cythonize([Extension(ext.name, [GEN_PYX], language="c++")], language_level=3, quiet=True,
                                   compiler_directives={"boundscheck": False, "wraparound": False})
                ext.sources = gen.sources + ext.sources
                ext.include_dirs.append(numpy.get_include())
        super().run()
        # in place: dpu/; for a wheel: build/lib*/dpu, where an earlier build's cores stay and
        # would be packed beside these (a leftover dpu/_core*.so is imported before _core.py)
        self._remove_stale_cores("dpu" if self.dpu_in_place else os.path.join(self.build_lib, "dpu"))

    def build_extension(self, ext):
        base = self.build_temp
        self.build_temp = os.path.join(base, ext.name.split(".")[-1])
        try:
            # A change of flags (DPU_NO_LTO, DPU_CORE_VARIANTS...) rebuilds what an earlier
            # build left in build/, which is otherwise taken as up to date.
            ext.depends = [d for d in ext.depends if not d.endswith(".flags")] + [self._flags_stamp(ext)]
            super().build_extension(ext)
        finally:
            self.build_temp = base
        if not self.dpu_in_place and not SANITIZE and not self.dry_run:
            self._split_debug_info(self.get_ext_fullpath(ext.name))

    def _flags_stamp(self, ext):
        text = "\n".join(ext.sources + ext.extra_compile_args + ext.extra_link_args) + "\n"
        path = os.path.join(self.build_temp, "build.flags")
        os.makedirs(self.build_temp, exist_ok=True)
        try:
            with open(path) as f:
                if f.read() == text:
                    return path
        except OSError:
            pass
        with open(path, "w") as f:
            f.write(text)
        return path

    def _split_debug_info(self, path):
        """A wheel ships without debug info (28 MB of the LTO core's 30): it goes to
        build/debug/<name>.debug, which the stripped file names (gdb finds it there or in
        /usr/lib/debug/.build-id)."""
        objcopy = shutil.which("objcopy")
        if not objcopy:
            print(f"setup.py: warning: no objcopy (binutils): {os.path.basename(path)} keeps its debug info",
                  file=sys.stderr)
            return
        debug_dir = os.path.join(os.path.dirname(self.build_temp), "debug")
        os.makedirs(debug_dir, exist_ok=True)
        debug = os.path.join(debug_dir, os.path.basename(path) + ".debug")
        subprocess.run([objcopy, "--only-keep-debug", "--compress-debug-sections", path, debug], check=True)
        subprocess.run([objcopy, "--strip-debug", f"--add-gnu-debuglink={debug}", path], check=True)

    def _remove_stale_cores(self, where):
        """``where`` (dpu/ in place, the wheel's dpu/ otherwise) holds the cores just built and
        no other: an older one (a level not built this time, or the single dpu/_core of
        before) would be loaded instead."""
        from importlib.machinery import EXTENSION_SUFFIXES

        built = {os.path.basename(self.get_ext_filename(e.name)) for e in self.extensions}
        for name in ["_core"] + [f"_core_{v}" for v in CPU.BY_NAME]:
            for suffix in EXTENSION_SUFFIXES:
                path = os.path.join(where, name + suffix)
                if os.path.basename(path) not in built and os.path.exists(path):
                    os.remove(path)


setup(ext_modules=[_core(v) for v in CPU.VARIANTS] + [GEN], cmdclass={"build_ext": BuildExt})
