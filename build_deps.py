"""When a cached object of setup.py's build is current: the dependency files the compiler writes,
and the compile line it was built with.

g++ -MMD and nvcc -MD write, beside each object, the make-style list of the files it was built
from (its source and every non-system header it included). An object is rebuilt when any of them
is newer, so a header change rebuilds only the objects that include it. The compile line (the
compiler, its flags, the include paths) is kept beside the object too (`.cmd`), so a change of
flags (say -O2 to -O3) rebuilds the objects it concerns in every tree, not only in fresh clones:
one small file read per object. Kept apart from setup.py so that tests can import it (setup.py
runs the build when imported).
"""
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path


def depfile_inputs(dep, obj):
    """The files a make-style dependency file (written by -MMD / nvcc -MD) lists for `obj`, or None
    if there is none, or it was written for another tree (build/obj copied from elsewhere)."""
    try:
        text = dep.read_text()
    except OSError:
        return None
    target, _, rest = text.partition(":")
    if Path(target.strip()) != obj.resolve():
        return None
    return [w for w in rest.replace("\\\n", " ").split() if w != "\\"]


def object_is_current(obj, src, dep, all_headers_mtime):
    """True if `obj` need not be rebuilt: it exists and nothing its dependency file lists is newer
    (without a usable dependency file: nothing newer than it among `src` and all headers)."""
    if not obj.exists():
        return False
    built = obj.stat().st_mtime
    inputs = depfile_inputs(dep, obj)
    if inputs is None:  # an object from before dependency files: any header change rebuilds it
        return built >= max(src.stat().st_mtime, all_headers_mtime)
    try:
        return all(Path(f).stat().st_mtime <= built for f in inputs + [str(src)])
    except OSError:  # a listed header was removed or renamed
        return False


def compile_record(obj):
    """The file beside `obj` that holds the line it was compiled with."""
    return obj.with_suffix(".cmd")


def compile_if_stale(obj, src, dep, all_headers_mtime, command, run=subprocess.run, adopt_unrecorded=False):
    """Compiles `obj` by `command` (a list) unless it is current (object_is_current) and was compiled
    by the same line; records the line once the compiler succeeded. Returns whether it compiled.

    An object without a record (built before records were kept, or its compile cut short) is
    compiled again, its flags unknown, unless `adopt_unrecorded`: then, if current, it is taken as
    built by `command` and the line recorded (setup.py adopts the objects of modules whose flags
    did not change since records began, so that keying by flags costs no tree a full rebuild)."""
    with object_lock(obj):
        record, line = compile_record(obj), " ".join(map(str, command))
        try:
            same_line = record.read_text() == line
        except OSError:  # no record
            same_line = adopt_unrecorded
        if same_line and object_is_current(obj, src, dep, all_headers_mtime):
            if not record.exists():
                record.write_text(line)
            return False
        record.unlink(missing_ok=True)  # (an interrupted compile must not leave the old line beside a new object)
        run(command, check=True)
        record.write_text(line)
        return True


@contextlib.contextmanager
def held_lock(path):
    """Holds the lock file `path` (flock: released when its holder exits, even killed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def object_lock(obj):
    """Holds `obj`'s lock file (beside it) while one build checks and compiles it. Two builds may run
    in one tree at once (scripts/setup.sh starts the core's compile while pip still installs torch,
    then the whole build joins it): the later one waits for an object the other is compiling, then
    finds it current, instead of compiling it again into the same file."""
    return held_lock(obj.with_suffix(".lock"))


def object_name(source, tag, python_abi):
    """The cached object's file name for `source` (relative to the tree): the path flattened, then
    `python_abi` (the interpreter's SOABI, e.g. cpython-311-x86_64-linux-gnu), then `tag` (the
    module's: CUDA architectures, torch version). Every source compiled with Python's headers on the
    include path carries the ABI: two Pythons building in one tree would otherwise reuse each other's
    objects, since each object's dependency list names its own Python's headers, which the other
    build never touches. CUDA kernel files (.cu) include no Python header: `python_abi` None."""
    name = str(source).replace("/", "_")
    return name + (f".{python_abi}" if python_abi else "") + tag + ".o"



def linked_libraries(link_flags):
    """The library files `link_flags` name (each -lNAME found as libNAME.so or libNAME.a in one of
    its -L directories; libraries the linker finds elsewhere, the system's, are not listed)."""
    dirs = [f[2:] for f in link_flags if f.startswith("-L")]
    found = []
    for name in (f[2:] for f in link_flags if f.startswith("-l")):
        for d in dirs:
            hits = [Path(d) / f"lib{name}{ext}" for ext in (".so", ".a")]
            hit = next((h for h in hits if h.exists()), None)
            if hit is not None:
                found.append(str(hit))
                break
    return found


def copy_is_current(src, dst):
    """True if `dst` is a copy of `src` as link_module makes it (shutil.copy2 keeps the time): the same
    size and modification time."""
    try:
        a, b = os.stat(src), os.stat(dst)
    except OSError:
        return False
    return a.st_size == b.st_size and a.st_mtime_ns == b.st_mtime_ns


def link_module(module, inputs, record, command, link, copies=(), run=subprocess.run, say=print):
    """Links `module` by `link` (a list whose "-o" argument is a temporary name) unless
    module_is_current(module, inputs, record, command), then renames that over `module` (a process
    that has the old one loaded keeps its inode) and records `command`; then copies it to each of
    `copies` (through a temporary name, renamed) unless that copy is current. All of it holds the
    module's lock (beside `record`): scripts/setup.sh's early build and the whole build both link
    _C and _C_cuda in a fresh clone, at about the same time; the second waits, then finds the module
    and its copies current instead of linking and copying over the first's. Returns whether it linked."""
    record = Path(record)
    with held_lock(record.with_name(record.name + ".lock")):
        linked = not module_is_current(module, inputs, record, command)
        if linked:
            say(" ".join(map(str, link)))
            run(link, check=True)
            os.replace(link[link.index("-o") + 1], module)
            record.write_text(command)
        else:
            say(f"{Path(module).name}: objects and libraries unchanged, not linked again")
        for dst in copies:
            if not copy_is_current(module, dst):
                tmp = Path(dst).with_name(Path(dst).name + f".tmp{os.getpid()}")
                shutil.copy2(module, tmp)
                os.replace(tmp, dst)
        return linked


def module_is_current(module, inputs, record, command):
    """True if the linked `module` need not be linked again: it exists, the link line recorded in
    `record` when it was linked is `command` (the same objects, libraries and flags), and none of
    `inputs` (its objects and the library files it links) is newer than it."""
    try:
        if record.read_text() != command:
            return False
        built = module.stat().st_mtime
        return all(Path(f).stat().st_mtime <= built for f in inputs)
    except OSError:  # no module, no record, or an input gone
        return False


# --- One compile pool over every module's objects, longest first (setup.py) -----------------------
# The modules used to be built one after another, each with its own pool of os.cpu_count() threads,
# so each module's last compile left a core idle (CI's 2 cores: a torch-backend file of 10-20 s, the
# plan kernel's nvcc run of 76 s+). One pool over all objects, the longest started first, leaves only
# the shortest objects for the end; each module is linked as soon as its own objects are built.

# Without a recorded duration (a fresh clone), a compile's seconds are guessed from what it is: the
# CUDA files (nvcc, two architectures), then the torch backend's (torch's headers: 10-25 s of CPU
# each), then the core's, the larger first (the bindings' pybind11 files are the slowest of those).
GUESSED_SECONDS = {".cu": 120.0, "_C_torch": 25.0}
COMPILE_SECONDS = "compile_seconds.json"  # in the object folder: each object's last compile time


def guessed_seconds(source, module):
    """A fresh clone's guess of how long `source` (of `module`, e.g. "commlib._C") takes to compile:
    only the order of guesses matters (longest first)."""
    source = Path(source)
    if source.suffix == ".cu":
        return GUESSED_SECONDS[".cu"]
    if module.endswith("_C_torch"):
        return GUESSED_SECONDS["_C_torch"]
    try:
        size = source.stat().st_size
    except OSError:
        size = 0
    return 1.0 + size / 4000  # (a 20 KB bindings file: 6 s; a 300 B one: 1 s)


def read_compile_seconds(obj_dir):
    """{object file name: seconds its last compile took} recorded by the last build in `obj_dir`
    ({} when none: a fresh clone, or a file cut short)."""
    try:
        data = json.loads((Path(obj_dir) / COMPILE_SECONDS).read_text())
        return {str(k): float(v) for k, v in data.items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def write_compile_seconds(obj_dir, seconds):
    """Adds `seconds` ({object file name: seconds}) to `obj_dir`'s record (written to a temporary
    name, then renamed: a build cut short leaves the old record whole)."""
    path = Path(obj_dir) / COMPILE_SECONDS
    merged = dict(read_compile_seconds(obj_dir), **seconds)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(merged, indent=0, sort_keys=True))
    os.replace(tmp, path)


def longest_first(jobs):
    """`jobs` (each with .seconds, the expected compile time) in the order a pool should start them:
    the longest first; ties in their given order."""
    return sorted(jobs, key=lambda j: -j.seconds)


class CompileJob:
    """One object of `module` (e.g. "commlib._C") to compile: `run()` compiles it if stale and
    returns the object's path (None for a file the module needs built but does not link: its
    precompiled header); `seconds`: how long it is expected to take (the pool's order)."""

    def __init__(self, module, name, run, seconds):
        self.module, self.name, self.run, self.seconds = module, name, run, seconds


class _NotStarted(Exception):
    """A compile the pool did not start because another had failed."""


def build_in_one_pool(jobs, link, workers):
    """Runs every module's compile `jobs` in one pool of `workers` threads, started longest first,
    and calls `link(module, objects)` (in this thread, while the pool compiles the rest) for each
    module as soon as all of its objects are built, the objects in the order its jobs were given. A
    failed compile stops the compiles not yet started (a pool thread checks before it starts one:
    no race with this thread's wake-up), waits for the running ones and raises; no module with a
    failed object is linked."""
    modules = list(dict.fromkeys(j.module for j in jobs))
    failed_once = threading.Event()

    def guarded(job):
        def run():
            if failed_once.is_set():
                raise _NotStarted(job.name)
            try:
                return job.run()
            except BaseException:
                failed_once.set()
                raise
        return run

    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        futures = {id(j): pool.submit(guarded(j)) for j in longest_first(jobs)}
        pending = {m: [futures[id(j)] for j in jobs if j.module == m] for m in modules}
        while pending:
            failed = next((f for fs in pending.values() for f in fs if f.done() and f.exception() is not None
                           and not isinstance(f.exception(), _NotStarted)), None)
            if failed is not None:
                raise failed.exception()
            for m in [m for m, fs in pending.items() if all(f.done() and f.exception() is None for f in fs)]:
                link(m, [o for o in (f.result() for f in pending.pop(m)) if o is not None])
            # Only the compiles not yet done, and only after linking what is ready: wait() returns at
            # once while any future given is done (passing finished ones spun this thread on a core
            # the compiles need), and a compile may wait for a module's link (the tests' case).
            running = [f for fs in pending.values() for f in fs if not f.done()]
            if running:
                wait(running, return_when=FIRST_COMPLETED)
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def cuda_gencode(archs, one_ptx):
    """nvcc's -gencode arguments. By default each architecture's own PTX and machine code, and the
    newest one's PTX in the module too, so newer GPUs JIT-compile it. With one_ptx, the first
    architecture's PTX alone (one front-end run), assembled into every architecture's machine code,
    and no PTX in the module (for a build that proves the code, not one that runs on a GPU)."""
    if one_ptx:
        return ["-gencode", f"arch=compute_{archs[0]},code=[{','.join(f'sm_{a}' for a in archs)}]"]
    out = []
    for a in archs:
        out += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    return out + ["-gencode", f"arch=compute_{archs[-1]},code=compute_{archs[-1]}"]


def unity_groups(sources, root, obj_dir, groups, folder="csrc/bindings", stem="unity_bindings"):
    """`sources` (relative to `root`) with `folder`'s files (csrc/bindings', csrc/torch_backend's)
    replaced by `groups` generated files `stem`_<i>.cc in `obj_dir` that #include them (setup.py's
    COMMLIB_UNITY_BINDINGS), as (sources, {generated file: its members}), both relative to `root`.
    Members go to the group with the fewest bytes so far, the largest first (a group's compile time
    follows its bytes beyond the headers' fixed cost). A group's file is written only when its text
    changes, so that its age says when its list did (its members' own changes are in its -MMD list)."""
    root, obj_dir = Path(root), Path(obj_dir)
    members = [s for s in sources if s.startswith(folder.rstrip("/") + "/")]
    if not members:
        return list(sources), {}
    size = {m: (root / m).stat().st_size for m in members}
    bins = [[] for _ in range(min(groups, len(members)))]
    for m in sorted(members, key=lambda m: (-size[m], m)):
        min(bins, key=lambda b: sum(size[x] for x in b)).append(m)
    obj_dir.mkdir(parents=True, exist_ok=True)
    made = {}
    for i, group in enumerate(bins):
        text = f"// Generated by setup.py (COMMLIB_UNITY_BINDINGS): these {folder} files in one object.\n" + "".join(
            f'#include "{Path(m).relative_to("csrc")}"\n' for m in sorted(group))
        path = obj_dir / f"{stem}_{i}.cc"
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        made[str(path.relative_to(root))] = sorted(group)
    return [s for s in sources if s not in members] + sorted(made), made
