"""setup.py's object cache: an object is rebuilt exactly when a file it was built from changed, and a
module linked again exactly when one of its objects or libraries, or its link line, changed."""
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from build_deps import (CompileJob, build_in_one_pool, compile_if_stale, compile_record,  # noqa: E402
                        copy_is_current, depfile_inputs, guessed_seconds, link_module, linked_libraries,
                        longest_first, module_is_current, object_is_current, object_name, read_compile_seconds,
                        write_compile_seconds)

pytestmark = pytest.mark.timeout(60)


def _age(path, seconds):
    t = path.stat().st_mtime - seconds
    os.utime(path, (t, t))


@pytest.fixture
def built(tmp_path):
    """A source including one of two headers, compiled by g++ with -MMD like setup.py does."""
    (tmp_path / "used.h").write_text("int used();\n")
    (tmp_path / "unused.h").write_text("int unused();\n")
    src = tmp_path / "a.cc"
    src.write_text('#include "used.h"\nint f() { return 1; }\n')
    obj, dep = tmp_path / "a.o", tmp_path / "a.d"
    for f in (src, tmp_path / "used.h", tmp_path / "unused.h"):
        _age(f, 100)
    subprocess.run(["g++", "-c", str(src), "-o", str(obj), "-MMD", "-MF", str(dep)], check=True)
    _age(obj, 10)  # so that a later touch() is newer even where timestamps are coarse
    return tmp_path, src, obj, dep


def test_depfile_lists_source_and_included_headers(built):
    root, src, obj, dep = built
    inputs = [Path(p).name for p in depfile_inputs(dep, obj)]
    assert inputs == ["a.cc", "used.h"]


def test_only_an_included_header_makes_the_object_stale(built):
    root, src, obj, dep = built
    newest_header = (root / "unused.h").stat().st_mtime
    assert object_is_current(obj, src, dep, newest_header)
    (root / "unused.h").touch()  # not included: stays current
    assert object_is_current(obj, src, dep, (root / "unused.h").stat().st_mtime)
    (root / "used.h").touch()
    assert not object_is_current(obj, src, dep, 0)


def test_source_change_and_missing_object_rebuild(built):
    root, src, obj, dep = built
    src.touch()
    assert not object_is_current(obj, src, dep, 0)
    obj.unlink()
    assert not object_is_current(obj, src, dep, 0)


def test_removed_header_rebuilds(built):
    root, src, obj, dep = built
    (root / "used.h").unlink()
    assert not object_is_current(obj, src, dep, 0)


def test_depfile_of_another_tree_falls_back_to_every_header(built, tmp_path_factory):
    # build/obj copied from another checkout: its dependency files name the other tree's files.
    root, src, obj, dep = built
    other = tmp_path_factory.mktemp("copy")
    obj2, dep2 = other / "a.o", other / "a.d"
    obj2.write_bytes(obj.read_bytes())
    dep2.write_text(dep.read_text())
    assert depfile_inputs(dep2, obj2) is None
    built_at = obj2.stat().st_mtime
    assert object_is_current(obj2, src, dep2, built_at - 1)
    assert not object_is_current(obj2, src, dep2, built_at + 1)


def test_no_depfile_falls_back_to_every_header(built):
    root, src, obj, dep = built
    dep.unlink()
    built_at = obj.stat().st_mtime
    assert object_is_current(obj, src, dep, built_at - 1)
    assert not object_is_current(obj, src, dep, built_at + 1)


def test_objects_of_two_pythons_have_two_names():
    # Built against 3.11's headers, an object must not be taken for 3.12's build of the same source
    # (its dependency list names 3.11's headers, which the 3.12 build never touches).
    a = object_name("csrc/host/communicator.cc", "", "cpython-311-x86_64-linux-gnu")
    b = object_name("csrc/host/communicator.cc", "", "cpython-312-x86_64-linux-gnu")
    assert a != b and a.startswith("csrc_host_communicator.cc.") and a.endswith(".o")
    assert object_name("csrc/kernels/k.cu", ".cuda", None) == "csrc_kernels_k.cu.cuda.o"  # no Python header


def test_setup_names_objects_with_the_python_abi():
    # setup.py cannot be imported (it builds): its object names are read from its text.
    text = (Path(__file__).resolve().parents[2] / "setup.py").read_text()
    assert 'PYTHON_ABI = sysconfig.get_config_var("SOABI")' in text
    assert 'object_name(rel, tag, None if src.endswith(".cu") else PYTHON_ABI)' in text



@pytest.fixture
def linked(tmp_path):
    """A module linked by g++ from two objects and a static library, its link line recorded as
    setup.py records it."""
    for name in ("a", "b", "extra"):
        (tmp_path / f"{name}.cc").write_text(f"int {name}() {{ return 1; }}\n")
        subprocess.run(["g++", "-c", "-fPIC", str(tmp_path / f"{name}.cc"), "-o", str(tmp_path / f"{name}.o")],
                       check=True)
    subprocess.run(["ar", "rcs", str(tmp_path / "libextra.a"), str(tmp_path / "extra.o")], check=True)
    objects = [str(tmp_path / "a.o"), str(tmp_path / "b.o")]
    flags = [f"-L{tmp_path}", "-lnot_in_any_l_dir", "-lextra", "-pthread"]
    for f in objects + [str(tmp_path / "libextra.a")]:
        _age(Path(f), 100)
    module = tmp_path / "m.so"
    subprocess.run(["g++", "-shared", "-o", str(module)] + objects + [f"-L{tmp_path}", "-lextra", "-pthread"], check=True)
    _age(module, 10)
    record, command = tmp_path / "m.so.link", " ".join([str(module)] + objects + flags)
    record.write_text(command)
    return module, objects, flags, record, command


def test_linked_libraries_are_the_files_of_the_l_flags(linked):
    module, objects, flags, record, command = linked
    # (-lnot_in_any_l_dir is in no -L directory: a system library, not tracked)
    assert linked_libraries(flags) == [str(module.parent / "libextra.a")]


def test_a_module_is_linked_again_only_when_an_input_or_its_line_changed(linked):
    module, objects, flags, record, command = linked
    inputs = objects + linked_libraries(flags)
    assert module_is_current(module, inputs, record, command)  # nothing changed: not linked again
    Path(objects[1]).touch()  # an object rebuilt
    assert not module_is_current(module, inputs, record, command)
    _age(Path(objects[1]), 100)
    assert module_is_current(module, inputs, record, command)
    (module.parent / "libextra.a").touch()  # a library it links (torch's, cudart) reinstalled
    assert not module_is_current(module, inputs, record, command)
    _age(module.parent / "libextra.a", 100)
    assert not module_is_current(module, inputs, record, command.replace(" -pthread", ""))  # other flags
    assert not module_is_current(module, inputs[1:], record, " ".join([str(module)] + objects[1:] + flags))
    record.unlink()  # linked by a setup.py that kept no line
    assert not module_is_current(module, inputs, record, command)
    record.write_text(command)
    module.unlink()
    assert not module_is_current(module, inputs, record, command)


def test_setup_links_through_module_is_current():
    # setup.py cannot be imported (it builds): read that its link and copy go through link_module.
    text = (Path(__file__).resolve().parents[2] / "setup.py").read_text()
    assert "link_module(out, objects + linked_libraries(flags), record, command, link," in text
    assert "if not copy_is_current(built(e), self.get_ext_fullpath(e.name))]" in text and "shutil.copy2" not in text


def test_two_builds_link_and_copy_a_module_once(linked):
    """A fresh clone's early build (scripts/setup.sh) and the whole build both link _C: the second waits for
    the module's lock, then finds it and its copy current (without the lock both link); a third does nothing."""
    module, objects, flags, record, command = linked
    record.unlink()  # stale: linked by neither build yet
    tmp, copy = module.with_name("m.so.tmp"), module.parent / "inplace" / "m.so"
    link = ["g++", "-shared", "-o", str(tmp)] + objects + [f"-L{module.parent}", "-lextra", "-pthread"]
    copy.parent.mkdir()
    runs, did, first_running, second_tried = [], {}, threading.Event(), threading.Event()

    def run(cmd, check):
        runs.append(threading.current_thread().name)
        first_running.set()
        second_tried.wait(timeout=10)  # (the second build asks while this link runs)
        return subprocess.run(cmd, check=check)

    def build(name):
        did[name] = link_module(module, objects, record, command, link, copies=[copy], run=run, say=lambda s: None)

    first, second = (threading.Thread(target=build, args=(n,), name=n) for n in ("first", "second"))
    first.start()
    assert first_running.wait(timeout=10)
    second.start()
    second.join(timeout=1.0)  # still waiting for the module's lock: the link above runs
    assert second.is_alive()
    second_tried.set()
    first.join(timeout=30), second.join(timeout=30)
    assert runs == ["first"] and did == {"first": True, "second": False}
    assert module_is_current(module, objects, record, command) and copy_is_current(module, copy)
    assert copy.read_bytes() == module.read_bytes() and not tmp.exists()
    inode = copy.stat().st_ino
    assert not link_module(module, objects, record, command, link, copies=[copy], run=run, say=lambda s: None)
    assert copy.stat().st_ino == inode and runs == ["first"]


def test_a_changed_compile_line_recompiles_and_the_same_line_does_not(built):
    """setup.py compiles through compile_if_stale, which keeps each object's compile line beside it:
    the same line leaves a current object alone; other flags (session 21's -O2 to -O3 -DNDEBUG for
    _C_torch) compile it again, with a real g++ here; an object without a line (from before lines
    were kept) is compiled again too, its flags unknown."""
    root, src, obj, dep = built
    runs = []

    def run(cmd, check):
        runs.append(cmd)
        return subprocess.run(cmd, check=check)

    o2 = ["g++", "-c", str(src), "-o", str(obj), "-MMD", "-MF", str(dep), "-O2"]
    o3 = o2[:-1] + ["-O3", "-DNDEBUG"]
    assert compile_if_stale(obj, src, dep, 0, o2, run) and runs == [o2]  # no line yet: compiled
    assert compile_record(obj).read_text() == " ".join(o2)
    _age(obj, 10)
    assert not compile_if_stale(obj, src, dep, 0, o2, run) and runs == [o2]  # same line: nothing
    assert compile_if_stale(obj, src, dep, 0, o3, run) and runs == [o2, o3]  # new flags: compiled
    assert compile_record(obj).read_text() == " ".join(o3)
    _age(obj, 10)
    assert not compile_if_stale(obj, src, dep, 0, o3, run)
    (root / "used.h").touch()  # the dependency list still counts with a line kept
    assert compile_if_stale(obj, src, dep, 0, o3, run) and len(runs) == 3


def test_an_object_from_before_the_lines_is_adopted_only_where_asked(built):
    root, src, obj, dep = built
    runs = []
    o3 = ["g++", "-c", str(src), "-o", str(obj), "-MMD", "-MF", str(dep), "-O3"]
    assert not compile_if_stale(obj, src, dep, 0, o3, lambda c, check: runs.append(c), adopt_unrecorded=True)
    assert runs == [] and compile_record(obj).read_text() == " ".join(o3)  # adopted: its line recorded
    compile_record(obj).unlink()
    assert compile_if_stale(obj, src, dep, 0, o3, lambda c, check: runs.append(c))  # not adopted: compiled
    assert runs == [o3]
    compile_record(obj).unlink()
    src.touch()  # adopted only when current
    assert compile_if_stale(obj, src, dep, 0, o3, lambda c, check: runs.append(c), adopt_unrecorded=True)


def test_a_failed_compile_keeps_no_line(built):
    root, src, obj, dep = built
    bad = ["g++", "-c", str(src), "-o", str(obj), "-MMD", "-MF", str(dep), "-fno-such-flag"]
    compile_record(obj).write_text("an older line")
    with pytest.raises(subprocess.CalledProcessError):
        compile_if_stale(obj, src, dep, 0, bad, lambda c, check: subprocess.run(c, check=check, capture_output=True))
    assert not compile_record(obj).exists()  # the next build compiles it again


def test_two_builds_in_one_tree_compile_an_object_once(built):
    """scripts/setup.sh's early build and the whole build run at once in a fresh clone: the one that
    comes second to a stale object waits while the first compiles it (build_deps.object_lock), then
    finds it current; without the lock both compile it into the same file."""
    root, src, obj, dep = built
    src.touch()  # stale
    cmd = ["g++", "-c", str(src), "-o", str(obj), "-MMD", "-MF", str(dep)]
    runs, first_running, second_tried = [], threading.Event(), threading.Event()

    def run(c, check):
        runs.append(threading.current_thread().name)
        first_running.set()
        second_tried.wait(timeout=10)  # (the second build asks while this compile runs)
        return subprocess.run(c, check=check)

    compiled = {}

    def build(name):
        compiled[name] = compile_if_stale(obj, src, dep, 0, cmd, run)

    first = threading.Thread(target=build, args=("first",), name="first")
    first.start()
    assert first_running.wait(timeout=10)
    second = threading.Thread(target=build, args=("second",), name="second")
    second.start()
    second.join(timeout=1.0)  # still waiting for the object's lock: the compile above runs
    assert second.is_alive()
    second_tried.set()
    first.join(timeout=30)
    second.join(timeout=30)
    assert runs == ["first"] and compiled == {"first": True, "second": False}
    assert object_is_current(obj, src, dep, 0)


def test_setup_compiles_through_compile_if_stale():
    # setup.py cannot be imported (it builds): read that every object goes through the check.
    text = (Path(__file__).resolve().parents[2] / "setup.py").read_text()
    assert "compile_if_stale(obj, Path(src), dep, headers, cmd, run=run_printed," in text
    assert 'adopt_unrecorded=not ext.name.endswith("_C_torch"))' in text
    assert "subprocess.run(cmd, check=True)" not in text.split("def run_printed")[1].split("out = Path")[0]


# --- One pool over every module's compiles (build_in_one_pool) ------------------------------------

def _job(module, name, seconds, ran, action=None):
    def run():
        ran.append(name)
        if action is not None:
            action()
        return name + ".o"
    return CompileJob(module, name, run, seconds)


def test_the_pool_starts_the_longest_compiles_first_across_modules():
    ran, links = [], []
    jobs = [_job("_C", "small", 1, ran), _job("_C", "mid", 5, ran), _job("_C_cuda", "kernel", 120, ran),
            _job("_C_torch", "backend", 25, ran), _job("_C", "also_small", 1, ran)]
    build_in_one_pool(jobs, lambda m, objs: links.append((m, objs)), workers=1)
    assert ran == ["kernel", "backend", "mid", "small", "also_small"]  # ties keep their given order
    # each module linked once, with its objects in its sources' order (the link line stays the same)
    assert sorted(links) == [("_C", ["small.o", "mid.o", "also_small.o"]), ("_C_cuda", ["kernel.o"]),
                             ("_C_torch", ["backend.o"])]
    assert [j.name for j in longest_first(jobs)] == ran


def test_a_file_built_for_a_module_but_not_linked_is_left_out_of_its_link():
    # (the torch backend's precompiled header: built first, in the pool, not an object)
    ran, links = [], []
    header = CompileJob("_C_torch", "headers.h.gch", lambda: ran.append("gch"), 100)
    build_in_one_pool([header, _job("_C_torch", "backend", 25, ran)], lambda m, objs: links.append((m, objs)),
                      workers=1)
    assert ran == ["gch", "backend"] and links == [("_C_torch", ["backend.o"])]


def test_a_module_is_linked_while_the_pool_still_compiles_another():
    # _C_cuda's last compile waits until _C has been linked: linking only after every compile of
    # every module would never get there (the wait's timeout fails it).
    linked_c = threading.Event()
    waited = []
    ran, links = [], []
    jobs = [_job("_C", "a", 10, ran), _job("_C_cuda", "kernel", 5, ran, lambda: waited.append(linked_c.wait(20)))]

    def link(module, objects):
        links.append(module)
        if module == "_C":
            linked_c.set()
    build_in_one_pool(jobs, link, workers=2)
    assert waited == [True] and links == ["_C", "_C_cuda"]


def test_the_pool_waits_without_spinning_while_compiles_run():
    # One quick object, then two that run 1.5 s: while they run, the thread that links must sleep in
    # wait(), not spin (it once passed the finished future to wait() again and again, which returns
    # at once: a core of CI's two busy for the whole build). Its own CPU time says which.
    import time
    ran, links = [], []
    jobs = [_job("_C", "quick", 1, ran), _job("_C", "slow", 5, ran, lambda: time.sleep(1.5)),
            _job("_C_torch", "slow_too", 4, ran, lambda: time.sleep(1.5))]
    cpu = time.thread_time()
    build_in_one_pool(jobs, lambda m, objs: links.append(m), workers=3)
    assert sorted(links) == ["_C", "_C_torch"]
    assert time.thread_time() - cpu < 0.2  # spinning for 1.5 s costs far more, even on a loaded core

def test_a_failed_compile_links_nothing_of_its_module_and_cancels_what_had_not_started():
    ran, links = [], []

    def fail():
        raise subprocess.CalledProcessError(1, ["g++"])
    jobs = [_job("_C", "broken", 50, ran, fail), _job("_C", "later", 1, ran), _job("_C_torch", "t", 2, ran)]
    with pytest.raises(subprocess.CalledProcessError):
        build_in_one_pool(jobs, lambda m, objs: links.append(m), workers=1)
    assert ran == ["broken"] and links == []


def test_a_fresh_clone_guesses_cuda_then_torch_then_the_core_larger_first(tmp_path):
    big, small = tmp_path / "big.cc", tmp_path / "small.cc"
    big.write_text("x" * 40000)
    small.write_text("x" * 100)
    cu = guessed_seconds("csrc/kernels/k.cu", "commlib._C_cuda")
    torch = guessed_seconds("csrc/torch_backend/module.cc", "commlib._C_torch")
    assert cu > torch > guessed_seconds(big, "commlib._C") > guessed_seconds(small, "commlib._C") > 0


def test_compile_seconds_are_kept_between_builds(tmp_path):
    assert read_compile_seconds(tmp_path) == {}  # a fresh clone: none
    write_compile_seconds(tmp_path, {"a.o": 3.5, "b.o": 1.0})
    write_compile_seconds(tmp_path, {"b.o": 2.0})  # an incremental build adds to the record
    assert read_compile_seconds(tmp_path) == {"a.o": 3.5, "b.o": 2.0}
    (tmp_path / "compile_seconds.json").write_text('{"a.o": 3')  # cut short: ignored, not an error
    assert read_compile_seconds(tmp_path) == {}


def test_setup_builds_every_module_in_one_pool():
    # setup.py cannot be imported (it builds): read its text.
    text = (Path(__file__).resolve().parents[2] / "setup.py").read_text()
    assert "def build_extensions(self):" in text and "build_in_one_pool(jobs" in text
    assert "members = unity.get(str(rel), [str(rel)])" in text
    assert "guessed_seconds(str(ROOT / m), ext.name) for m in members)" in text
    assert "recorded.get(obj.name, guess)" in text
    assert "ThreadPoolExecutor" not in text  # no pool of its own per module


def test_the_torch_backend_is_compiled_with_its_precompiled_header():
    # One .gch of torch's headers, with exactly the objects' flags (torch_build()[1]), named by torch's
    # version and its header list (the objects' compile lines name it), waited for by every object
    # that includes it: the torch backend's own files (not common/alloc_count.cc, which includes none).
    text = (Path(__file__).resolve().parents[2] / "setup.py").read_text()
    assert ('pch = ["-Winvalid-pch", "-include", str(pch_header)] if pch_header and (\n'
            '                    TORCH_BACKEND in Path(src).parents or str(rel) in unity) else []' in text)
    assert "pch_header = torch_pch_header() if TORCH_PCH and any(" in text  # (none for unity files: CI)
    assert 'cmd = ["g++", "-c", src, "-o", str(obj), "-MMD", "-MF", str(dep)] + pch + torch_build()[1]' in text
    assert 'if "-include" in cmd:\n                    pch_built.result()' in text
    assert '"-MF",\n                   str(gch.with_suffix(".d"))] + torch_build()[1]' in text
    assert 'f"torch_headers.{PYTHON_ABI}.torch{torch_build()[0]}.{digest}.h"' in text

