"""Build for dpu: the pybind11 core (dpu._core) and the Cython helpers.

The native sources are plain C++17 (native/); only native/bindings/ sees
Python headers. Set DPU_NATIVE_ARCH=1 to compile for this CPU (-march=native).
"""
import importlib.util
import os
import subprocess
import sys
from glob import glob

# Run directly (`python3 setup.py ...`), this needs the build requirements in the running
# Python; pip and `python -m build` bring them into an environment of their own.
_MISSING = [m for m in ("setuptools", "pybind11", "Cython", "numpy") if importlib.util.find_spec(m) is None]
if _MISSING:
    sys.exit(f"setup.py: {', '.join(_MISSING)} not installed in {sys.executable}: `pip install -e '.[test]'` "
             "brings them with dpu (or build with `pip install .` / `python -m build`, which fetch them)")

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext  # noqa: E402
from setuptools import Extension, setup  # noqa: E402

ParallelCompile("DPU_BUILD_JOBS", default=os.cpu_count() or 2).install()

CXXFLAGS = ["-O3", "-g", "-std=c++17", "-fno-strict-aliasing", "-fno-plt", "-Wall", "-Wextra", "-Wno-unused-parameter"]
def _host_isa():
    """The instruction set to compile for.

    A wheel (bdist_wheel, `pip wheel`, `python -m build`) may run on another
    machine: the x86-64 baseline, unless DPU_HOST_ISA=1. A source build
    (`pip install -e .`, `setup.py build_ext --inplace`) runs where it is
    built: x86-64-v3 (AVX2, BMI2, SSE4.2) when this machine has it.
    DPU_NATIVE_ARCH=1 asks for -march=native, DPU_PORTABLE=1 for the baseline."""
    if os.environ.get("DPU_NATIVE_ARCH"):
        return ["-march=native"]
    if os.environ.get("DPU_PORTABLE"):
        return []
    if "bdist_wheel" in sys.argv and not os.environ.get("DPU_HOST_ISA"):
        return []
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    if {"avx2", "bmi2", "fma", "movbe", "sse4_2"} <= set(flags):
        return ["-march=x86-64-v3"]
    if "sse4_2" in flags:
        return ["-msse4.2"]
    return []


CXXFLAGS += _host_isa()
SANITIZE = ["-fsanitize=address,undefined", "-fno-wrapv"] if os.environ.get("DPU_DEBUG") else []
if SANITIZE:  # DPU_DEBUG=1: both extensions under ASan+UBSan (preload libasan/libubsan to run)
    CXXFLAGS = [f for f in CXXFLAGS if f != "-O3"] + ["-O0", "-g"] + SANITIZE
# Link-time optimisation of the core: a packet's conntrack stage calls across
# files (ct_stage.cc, conntrack.cc, ct_packet.cc, ct_tcp.cc), which only the
# linker can inline. With the batch loop's small helpers forced inline (the
# whole-program inliner left them out), every benchmark gains (8 rounds A/B
# against the same code without LTO: x1.01 to x1.07, snat-1m x1.06). The code
# is generated at link time, so the link gets the optimisation and ISA flags.
# DPU_NO_LTO=1, or DPU_DEBUG=1, builds without it.
LTO = [] if SANITIZE or os.environ.get("DPU_NO_LTO") else ["-flto=auto"]
LTO_LINK = LTO and LTO + ["-O3"] + _host_isa()


def _afxdp():
    """(compile flags, link flags) for the AF_XDP backend (native/src/ports/afxdp.cc) when
    pkg-config finds libxdp and libbpf; none otherwise, and afxdp.cc builds the stub that says
    how to get them. DPU_NO_AFXDP=1 builds the stub anyway."""
    if os.environ.get("DPU_NO_AFXDP"):
        return [], []
    try:
        r = subprocess.run(["pkg-config", "--cflags", "--libs", "libxdp", "libbpf"], capture_output=True, text=True)
    except OSError:
        return [], []
    if r.returncode != 0:
        return [], []
    flags = r.stdout.split()
    return ["-DDPU_HAVE_AFXDP"] + [f for f in flags if f.startswith("-I")], [f for f in flags if f.startswith(("-l", "-L"))]


AFXDP_CFLAGS, AFXDP_LIBS = _afxdp()
CORE_SOURCES = sorted(glob("native/src/*.cc")) + sorted(glob("native/src/*/*.cc")) + ["native/bindings/module.cc"]
HEADERS = sorted(glob("native/include/dpu/*")) + sorted(glob("native/src/*.h")) + sorted(glob("native/src/*/*.h"))

ext_modules = [
    Pybind11Extension(
        "dpu._core",
        CORE_SOURCES,
        include_dirs=["native/include", "native/src"],
        cxx_std=17,
        depends=HEADERS,
        extra_compile_args=CXXFLAGS + LTO + AFXDP_CFLAGS,
        extra_link_args=SANITIZE + LTO_LINK + AFXDP_LIBS,
    ),
]

cython_exts = [
    Extension(
        "dpu._gen",
        ["dpu/_gen.pyx", "native/src/pcap.cc"],
        include_dirs=["native/include", "native/src"],
        language="c++",
        extra_compile_args=(["-O0", "-g"] + SANITIZE if SANITIZE else ["-O3"]) + ["-std=c++17"],
        extra_link_args=SANITIZE,
    ),
]
if all(os.path.exists(e.sources[0]) for e in cython_exts):
    from Cython.Build import cythonize

    import numpy

    for e in cython_exts:
        e.include_dirs.append(numpy.get_include())
    ext_modules += cythonize(cython_exts, language_level=3, compiler_directives={"boundscheck": False, "wraparound": False})

setup(ext_modules=ext_modules, cmdclass={"build_ext": build_ext})
