"""Builds commlib._C (C++17 core) and, when nvcc is found, commlib._C_cuda (CUDA kernels).

Objects are cached under build/obj and recompiled only when their source or a header they include
changed (the compiler writes each object's dependency list beside it, -MMD) or their compile line
did (kept beside each object: a flags change recompiles what it concerns), and compiled in
parallel: a one-line change rebuilds in seconds instead of minutes. A module is linked again only
when one of its objects or libraries is newer than it or its link line changed (the line is kept
beside the objects), so a set-up with nothing changed links nothing.
"""
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import Future
from pathlib import Path

import pybind11
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from build_deps import (CompileJob, build_in_one_pool, compile_if_stale, copy_is_current,  # noqa: E402  (beside this file)
                        cuda_gencode, guessed_seconds, link_module, linked_libraries, object_name, read_compile_seconds,
                        unity_groups, write_compile_seconds)

CSRC = ROOT / "csrc"
OBJ_DIR = ROOT / "build" / "obj"
# The interpreter's ABI, in the name of every object built with its headers (build_deps.object_name).
PYTHON_ABI = sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag

# No -march=native: the build must run on any x86-64. Wider paths use target attributes.
CXXFLAGS = ["-std=c++17", "-O3", "-fPIC", "-fvisibility=hidden", "-pthread", "-Wall",
            "-Wno-unused-function", "-g1"]
INCLUDES = [str(CSRC), pybind11.get_include(), sysconfig.get_paths()["include"]]
# Files compiled at another level than CXXFLAGS' (the later -O wins). The emulated device's kernel
# executor instantiates the plan kernel's whole body for every dtype x op (about 45 times): at -O3
# it was the core's costliest object (97.5 CPU-s), at -O1 47.7. The tests that run it (the kernel
# path on the emulated device: six modules of tests/stream and tests/device, every process's CPU)
# took 30.8 and 29.9 CPU-s with it at -O3, 33.0 and 30.5 at -O1 (session 27): their time is the
# ranks' waits and the device's threads, not the element loops.
OPT_LEVEL_OF = {"csrc/device/emulated/emulated_plan_kernel.cc": "-O1"}
# COMMLIB_CUDA_ARCHS (params.cc): the architectures built; scripts/gpu_check.sh names the lent GPU's.
CUDA_ARCHS = [a.strip() for a in os.environ.get("COMMLIB_CUDA_ARCHS", "80,90").split(",") if a.strip()]
# COMMLIB_CUDA_ONE_PTX (params.cc; .ci/run sets it): the kernels' PTX compiled once, for the first
# architecture, and assembled for each (build_deps.cuda_gencode). nvcc's front end (cicc) is about two
# thirds of a .cu file's CPU per architecture (nvcc --time, session 27), and a CUDA module built where
# no GPU runs it only proves that the code compiles and fits each architecture's registers: both still
# hold, since no source branches on __CUDA_ARCH__'s value (tests/python/test_cuda_build.py) and
# ptxas, which reports spills, still runs for every architecture.
CUDA_ONE_PTX = bool(os.environ.get("COMMLIB_CUDA_ONE_PTX"))
# COMMLIB_UNITY_BINDINGS (params.cc; .ci/run sets it): the core's pybind11 files (csrc/bindings/*.cc) compiled
# as UNITY_GROUPS files that #include them, not one object each. pybind11's headers cost every file that
# includes them about 6 CPU-s (parsing them, and compiling the weak functions they define in each
# file again: a file of the headers alone, 5.8 CPU-s at -O3): core_api.cc, fast_call.cc and
# host_compressed_calls.cc took 23.4 CPU-s as three objects and 9.8 as one (session 28). For a build
# that proves the code (CI's fresh clone); the README's set-up keeps one object a file, so that a
# one-file change rebuilds that file alone, and so that each file is seen to include what it uses.
# In one file, two files' helpers of one name in an anonymous namespace clash: CI's build says so.
# The torch backend's files (csrc/torch_backend/*.cc) likewise: each loaded the 643 MB precompiled
# header of torch's headers (TORCH_PCH_HEADERS: about 10.5 CPU-s a file) and compiled again the torch
# inline code it uses: the 18 took 330.6 CPU-s as 18 objects, 85.3 as 3 (session 29). The helpers
# several of them use are in torch_backend/tensor_for_core.h; tests/python/test_unity_bindings.py
# checks that no two files of either folder define one name in an anonymous namespace.
UNITY_BINDINGS = bool(os.environ.get("COMMLIB_UNITY_BINDINGS"))
# As unity files the torch backend's three objects compile without the precompiled header: building it
# cost 40-55 CPU-s, more than the ~6.5 CPU-s a file it saves (unity file 2: 43.2 with it, 49.7
# without, session 30).
TORCH_PCH = not UNITY_BINDINGS
# COMMLIB_BINDINGS_O1 (params.cc; .ci/run sets it): the pybind11 files (csrc/bindings, or their unity
# files) and the torch backend's compiled at -O1, not -O3. They are glue between Python and the core:
# CI's build proves them and measures nothing, and at -O3 they were half of its C++ CPU. Unity file 0
# of the bindings took 45.2 CPU-s at -O3, 31.0 at -O1; the torch backend's unity file 2 (no
# precompiled header) 49.7 and 30.8 (session 30).
BINDINGS_O1 = bool(os.environ.get("COMMLIB_BINDINGS_O1"))
GLUE_FOLDERS = ("csrc/bindings", "csrc/torch_backend")
# module: (its folder compiled as unity files, their names' stem, how many). (4 for the core: enough
# to keep both cores of CI's pool busy beside the rest of the core; 3 for the torch backend's 18 files.)
UNITY_OF = {"commlib._C": ("csrc/bindings", "unity_bindings", 4),
            "commlib._C_torch": ("csrc/torch_backend", "unity_torch_backend", 3)}
# An object built for other architectures is not current: the tag names them unless they are the default.
CUDA_TAG = (".cuda" if CUDA_ARCHS == ["80", "90"] else ".cuda_sm" + "_".join(CUDA_ARCHS)) + (
    ".one_ptx" if CUDA_ONE_PTX else "")


def _rel(paths):
    # setuptools wants sources relative to setup.py.
    return sorted(str(p.relative_to(ROOT)) for p in paths)


TORCH_BACKEND = CSRC / "torch_backend"  # the c10d::Backend: built against torch, into commlib._C_torch


def core_sources():
    return _rel(p for p in CSRC.rglob("*.cc") if "cuda" not in p.name and TORCH_BACKEND not in p.parents)


def torch_backend_sources():
    # (with its own count of heap allocations, common/alloc_count.cc, linked as _C's is: the tests
    # that pin the C++ backend's steady CUDA calls at no allocation read it)
    return _rel(list(TORCH_BACKEND.glob("*.cc")) + [CSRC / "common" / "alloc_count.cc"])


@functools.lru_cache(maxsize=None)
def torch_build():
    """(version, compile flags, link flags) of the installed torch for commlib._C_torch, or None
    when torch is not importable (COMMLIB_NO_TORCH_BACKEND=1 skips it too). The flags are torch's
    own extension tooling's (torch.utils.cpp_extension): its headers (with its pybind11, so the
    module shares torch's pybind11 types), its C++ standard and ABI, its libraries (rpath'd)."""
    if os.environ.get("COMMLIB_NO_TORCH_BACKEND"):
        return None
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        return None
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    # -O3 -DNDEBUG as torch's extension tooling compiles (Python's CFLAGS): torch's inline code
    # compiled here (the ProcessGroup methods a CommlibProcessGroup calls, the dispatcher's call
    # path, tensor accessors) then runs as in torch's own build, without its debug-only checks.
    cflags = ["-std=c++20", "-O3", "-DNDEBUG", "-fPIC", "-fvisibility=hidden", "-pthread", "-Wall", "-Wno-unused-function",
              "-Wno-unused-parameter", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DTORCH_EXTENSION_NAME=_C_torch",
              "-DTORCH_API_INCLUDE_EXTENSION_H", f'-DCOMMLIB_TORCH_VERSION="{torch.__version__}"']
    cflags += [f"-isystem{p}" for p in cpp_extension.include_paths()]
    cflags += [f"-I{CSRC}", f"-isystem{sysconfig.get_paths()['include']}"]
    lib = cpp_extension.library_paths()[0]
    lflags = [f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    return torch.__version__, cflags, lflags


# The torch headers the torch backend's files include (directly or through csrc/torch_backend/*.h),
# compiled once into a precompiled header (g++ .gch) with exactly those files' flags and given to
# each of them by -include: parsing them was 16 of a file's 25 s of CPU. A file that includes one of
# them again gets it from the .gch (include guards); the .gch is compiled like an object
# (compile_if_stale: its line, its -MMD list) and named by torch's version and a hash of this list,
# and the objects' compile lines name it, so a new torch or a changed list rebuilds it and every
# object that used it. g++ checks that the .gch fits each compile (-Winvalid-pch says when not: the
# header's text is then parsed instead, as without it).
TORCH_PCH_HEADERS = ("torch/csrc/utils/pybind.h", "torch/csrc/distributed/c10d/ProcessGroup.hpp",
                     "torch/csrc/jit/python/pybind_utils.h", "ATen/ATen.h")
# CPU-s a file spends loading the .gch (common/alloc_count.cc, which uses none of it: 10.5 with, 0.1 without)
TORCH_PCH_LOAD_SECONDS = 10.5


def torch_pch_header():
    """The generated header the torch backend's objects -include (its .gch beside it), written only
    when its text changed (so that its age says when it did)."""
    text = "// Generated by setup.py (TORCH_PCH_HEADERS): precompiled once for commlib._C_torch's files.\n" + "".join(
        f"#include <{h}>\n" for h in TORCH_PCH_HEADERS)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    header = OBJ_DIR / f"torch_headers.{PYTHON_ABI}.torch{torch_build()[0]}.{digest}.h"
    if not header.exists() or header.read_text() != text:
        header.write_text(text)
    return header


def cuda_sources():
    # The CUDA module shares the dtype/op tables with the core (hidden visibility: no clash).
    return _rel(CSRC.rglob("*.cu")) + _rel(p for p in CSRC.rglob("*.cc") if "cuda" in p.name) + [
        "csrc/common/types.cc"]


def find_nvcc():
    if os.environ.get("COMMLIB_NO_CUDA"):
        return None
    nvcc = shutil.which("nvcc")
    if nvcc is None and os.environ.get("CUDA_HOME"):
        cand = Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"
        nvcc = str(cand) if cand.exists() else None
    return nvcc


def newest_header_mtime():
    return max((p.stat().st_mtime for p in CSRC.rglob("*") if p.suffix in (".h", ".cuh")), default=0)


class CachedBuildExt(build_ext):
    """Compiles every module's sources to build/obj once, in one pool (the longest first), and links
    each module as soon as its own objects are built (build_deps.build_in_one_pool)."""

    def build_extensions(self):
        self.check_extensions_list(self.extensions)
        self.build_all(self.extensions)

    def build_extension(self, ext):  # (setuptools' entry for one module alone)
        self.build_all([ext])

    def copy_extensions_to_source(self):
        # --inplace: setuptools then copies every module into the source tree again, in place (the file
        # rewritten, not renamed) and unlocked, while the other build of a fresh clone may link or load
        # it. link() copied each there under the module's lock (build_deps.link_module): setuptools
        # copies only what is not current.
        saved, built = self.extensions, lambda e: os.path.join(self.build_lib, self.get_ext_filename(e.name))
        self.extensions = [e for e in saved if not copy_is_current(built(e), self.get_ext_fullpath(e.name))]
        try:
            super().copy_extensions_to_source()
        finally:
            self.extensions = saved

    def build_all(self, exts):
        nvcc = find_nvcc()
        headers = newest_header_mtime()
        OBJ_DIR.mkdir(parents=True, exist_ok=True)
        recorded, took = read_compile_seconds(OBJ_DIR), {}

        def run_printed(cmd, check):  # (a line is printed only when it runs)
            print(" ".join(cmd), flush=True)
            return subprocess.run(cmd, check=check)

        pch_header = torch_pch_header() if TORCH_PCH and any(ext.name.endswith("_C_torch") for ext in exts) else None
        pch_built = Future()

        def pch_job(seconds):
            gch = pch_header.with_name(pch_header.name + ".gch")
            cmd = ["g++", "-x", "c++-header", str(pch_header), "-o", str(gch), "-MMD", "-MF",
                   str(gch.with_suffix(".d"))] + torch_build()[1]

            def run():
                try:
                    start = time.monotonic()
                    if compile_if_stale(gch, pch_header, gch.with_suffix(".d"), headers, cmd, run=run_printed):
                        took[gch.name] = round(time.monotonic() - start, 1)
                except BaseException as e:
                    pch_built.set_exception(e)
                    raise
                pch_built.set_result(str(gch))
                return None  # (no object of the module)
            return CompileJob("commlib._C_torch", gch.name, run, seconds)

        def compile_job(ext, src):
            src = str(ROOT / src)
            rel = Path(src).resolve().relative_to(ROOT)
            # (objects built against torch carry its version: its headers are not in the -MMD lists)
            tag = CUDA_TAG if ext.name.endswith("_cuda") else f".torch{torch_build()[0]}" if ext.name.endswith(
                "_C_torch") else ""
            obj = OBJ_DIR / object_name(rel, tag, None if src.endswith(".cu") else PYTHON_ABI)
            dep = obj.with_suffix(".d")
            if src.endswith(".cu"):
                cmd = [nvcc, "-c", src, "-o", str(obj), "-std=c++17", "-O3", "-Xcompiler", "-fPIC",
                       "-Xcompiler", "-fvisibility=hidden", "-MD", "-MF", str(dep)]
                cmd += cuda_gencode(CUDA_ARCHS, CUDA_ONE_PTX)
                # A kernel that spills registers fails the build (the kernel path's launch bounds
                # are chosen so that none does, on every architecture built).
                cmd += ["-Xptxas", "--warn-on-spills,--warning-as-error"]
                # One thread per architecture (0: as many as CPUs): the plan kernel's 45
                # instantiations take minutes per architecture, and the architectures are independent
                # (2m46 instead of about 5 min on 2 cores).
                cmd += ["--threads", "0"]
                cmd += [f"-I{i}" for i in INCLUDES]
            elif ext.name.endswith("_C_torch"):
                # (the torch headers' .gch only for the files that include them: loading the 643 MB
                # file cost common/alloc_count.cc 10.5 CPU-s, against 0.1 without it)
                # (and for the unity files that include them: COMMLIB_UNITY_BINDINGS)
                pch = ["-Winvalid-pch", "-include", str(pch_header)] if pch_header and (
                    TORCH_BACKEND in Path(src).parents or str(rel) in unity) else []
                cmd = ["g++", "-c", src, "-o", str(obj), "-MMD", "-MF", str(dep)] + pch + torch_build()[1]
                if BINDINGS_O1:
                    cmd += ["-O1"]  # (the later -O wins)
            else:
                cmd = ["g++", "-c", src, "-o", str(obj), "-MMD", "-MF", str(dep)] + CXXFLAGS + [
                    f"-I{i}" for i in INCLUDES]
                if str(rel) in OPT_LEVEL_OF:
                    cmd += [OPT_LEVEL_OF[str(rel)]]
                elif BINDINGS_O1 and (str(rel) in unity or str(rel).startswith(GLUE_FOLDERS)):
                    cmd += ["-O1"]
                if ext.name.endswith("_cuda"):
                    cmd += [f"-I{cuda_include(nvcc)}"]

            def run():
                if "-include" in cmd:
                    pch_built.result()  # (started before any of these: it raises if it failed)
                # Objects from before compile lines were kept are adopted (their flags are today's),
                # except _C_torch's: its flags changed in session 21 (-O3 -DNDEBUG) while trees kept
                # -O2 objects.
                start = time.monotonic()
                if compile_if_stale(obj, Path(src), dep, headers, cmd, run=run_printed,
                                    adopt_unrecorded=not ext.name.endswith("_C_torch")):
                    took[obj.name] = round(time.monotonic() - start, 1)  # (the next build's order)
                return str(obj)

            # (a unity file's guess: its members' guesses added up, less the precompiled header's load
            # each torch backend file after the first no longer pays: a group then stays behind the
            # CUDA files, so that the pool's second thread does not wait for the header while the first
            # builds it)
            members = unity.get(str(rel), [str(rel)])
            guess = sum(guessed_seconds(str(ROOT / m), ext.name) for m in members)
            if ext.name.endswith("_C_torch") and pch_header:
                guess -= TORCH_PCH_LOAD_SECONDS * (len(members) - 1)
            seconds = recorded.get(obj.name, guess)
            return CompileJob(ext.name, obj.name, run, seconds)

        unity, sources_of = {}, {ext.name: ext.sources for ext in exts}
        for name, (folder, stem, groups) in UNITY_OF.items():
            if UNITY_BINDINGS and name in sources_of:
                sources_of[name], made = unity_groups(sources_of[name], ROOT, OBJ_DIR, groups, folder, stem)
                unity.update(made)
        jobs = [compile_job(ext, src) for ext in exts for src in sources_of[ext.name]]
        if pch_header:
            jobs.insert(0, pch_job(max(j.seconds for j in jobs) + 1))  # (started first)
        by_name = {ext.name: ext for ext in exts}
        try:
            build_in_one_pool(jobs, lambda name, objects: self.link(by_name[name], objects, nvcc),
                              workers=os.cpu_count() or 2)
        finally:  # (the compiles that finished are recorded even when another failed)
            write_compile_seconds(OBJ_DIR, took)

    def link(self, ext, objects, nvcc):
        out = Path(self.get_ext_fullpath(ext.name))
        out.parent.mkdir(parents=True, exist_ok=True)
        # Link to a temporary name, then rename: processes that have the old module loaded keep
        # their (unlinked) inode instead of crashing on a file rewritten under them.
        tmp_out = out.with_name(out.name + f".tmp{os.getpid()}")
        flags = ["-pthread"]
        if ext.name.endswith("_cuda"):
            # Static cudart: importing works on machines without a CUDA install and reports
            # "no CUDA device" instead of failing to find libcudart.
            flags += [f"-L{cuda_lib(nvcc)}", "-lcudart_static", "-ldl", "-lrt"]
        if ext.name.endswith("_C_torch"):
            flags += torch_build()[2]
        if ext.name in ("commlib._C", "commlib._C_torch"):
            # commlib's operator new / new[] through a counting wrapper (csrc/common/alloc_count.h):
            # the tests that pin the device hot path at no allocation read it.
            flags += ["-Wl,--wrap=_Znwm,--wrap=_Znam"]
        link = ["g++", "-shared", "-o", str(tmp_out)] + objects + flags
        # (the recorded line names the module, not the temporary file it is linked to)
        record, command = OBJ_DIR / (out.name + ".link"), " ".join([str(out)] + objects + flags)
        # Editable installs build in a temporary folder; keep a copy beside the sources too. The link
        # and the copy hold the module's lock: a fresh clone's early build (scripts/setup.sh) and the
        # whole build both link _C and _C_cuda.
        inplace = ROOT / "commlib" / out.name
        link_module(out, objects + linked_libraries(flags), record, command, link,
                    copies=[inplace] if inplace.resolve() != out.resolve() else [],
                    say=lambda line: print(line, flush=True))
        if ext.name.endswith("_C_torch"):
            # The torch version it was built against, readable without loading the module (a module
            # built against another torch may not even load): commlib/torch/native.py checks it.
            (out.parent / "_C_torch.torch_version").write_text(torch_build()[0] + "\n")
            if inplace.resolve() != out.resolve():
                (inplace.parent / "_C_torch.torch_version").write_text(torch_build()[0] + "\n")


def cuda_home(nvcc):
    if os.environ.get("CUDA_HOME"):
        return Path(os.environ["CUDA_HOME"])
    home = Path(nvcc).resolve().parent.parent
    # nvcc may be a wrapper script (e.g. /usr/local/bin/nvcc exec'ing the real one): fall back to
    # the standard install location when the headers are not beside it.
    if not (home / "include" / "cuda_runtime_api.h").exists() and Path("/usr/local/cuda/include").exists():
        return Path("/usr/local/cuda")
    return home


def cuda_include(nvcc):
    return cuda_home(nvcc) / "include"


def cuda_lib(nvcc):
    home = cuda_home(nvcc)
    for cand in (home / "lib64", home / "lib", home / "targets" / "x86_64-linux" / "lib"):
        if (cand / "libcudart_static.a").exists():
            return cand
    return home / "lib64"


extensions = [Extension("commlib._C", sources=core_sources())]
if find_nvcc() and cuda_sources():
    extensions.append(Extension("commlib._C_cuda", sources=cuda_sources()))

if torch_build() is not None and torch_backend_sources():
    extensions.append(Extension("commlib._C_torch", sources=torch_backend_sources()))

setup(ext_modules=extensions, cmdclass={"build_ext": CachedBuildExt})
