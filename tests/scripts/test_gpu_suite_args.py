#!/usr/bin/env python3
"""scripts/gpu-suite.sh's arguments: a mistyped one stops the run before anything is written.

A prebuilt run packs OUTDIR's files into gpu-suite.tar.gz and removes them; it once took an
OUTDIR it could not make as '' (logs in /, then the current folder packed and emptied).
Checked here, on a copy of the script in a throwaway prebuilt folder (its BUILD-INFO) and
in a throwaway source tree, with no GPU:
- an OUTDIR that cannot be made (under a file), one that looks like an option, a non-empty
  one (the current folder, the prebuilt folder itself) and a list with an unknown step:
  exit 2, no step run, every file of the current folder and of the prebuilt folder kept;
- the same in a source tree for an option-like OUTDIR;
- `prebuild DIR` with a DIR that is no prebuilt folder, or '.': exit 2, DIR kept; an older
  prebuilt folder (BUILD-INFO) or an unfinished one (its mark) is taken;
- an empty OUTDIR and a new one: the env step runs (it fails without nvidia-smi: exit 1; 0
  on a GPU machine) and OUTDIR holds summary.txt and gpu-suite.tar.gz with env.log in it;
- SBN_SUITE_DEADLINE: a step that would run past it (a stand-in nvidia-smi that sleeps) is
  stopped there with everything it started, the next step is "not run", and the run ends
  by itself, packed, before an outer `timeout` a little longer would have cut it (that one
  stops the script but not the step it runs).
Usage: test_gpu_suite_args.py [SCRIPT] (default scripts/gpu-suite.sh; CTest gives mutants).
"""
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import checks  # noqa: E402
from checks import check  # noqa: E402

SCRIPT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                         os.path.join(HERE, "..", "..", "scripts", "gpu-suite.sh"))


def run(args, cwd, python=None):
    env = dict(os.environ)
    if python is not None:
        env["PYTHON"] = python
    p = subprocess.run(["bash", *args], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout + p.stderr


def listing(folder):
    """Every path below folder with its bytes (files) or None (folders)."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for d in dirs:
            out[os.path.relpath(os.path.join(root, d), folder)] = None
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                out[os.path.relpath(os.path.join(root, f), folder)] = fh.read()
    return out


def deadline_case(tmp, suite, work):
    """SBN_SUITE_DEADLINE=07 (7 s): the env step's limit (15 s) cut to 7 - 5 = 2 s or less; the stand-in
    nvidia-smi would sleep 6 s and then leave a mark. The outer timeout (12 s) is what call 1
    of next-gpu-run.md puts around the suite."""
    fake = os.path.join(tmp, "fakebin")
    os.makedirs(fake)
    mark = os.path.join(tmp, "late-mark")
    stub = os.path.join(fake, "nvidia-smi")
    with open(stub, "w") as f:
        f.write(f"#!/bin/sh\nsleep 6\ntouch '{mark}'\n")
    os.chmod(stub, 0o755)
    outdir = os.path.join(tmp, "dl")
    # "07": decimal, as a user means it (bash arithmetic would read it as octal; "08" stopped
    # the step loop with an empty summary and exit 0)
    env = dict(os.environ, PATH=fake + os.pathsep + os.environ["PATH"], SBN_SUITE_DEADLINE="07")
    t0 = time.monotonic()
    p = subprocess.run(["timeout", "-k", "2", "12", "bash", suite, outdir, "env", "targets"], cwd=work,
                       env=env, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    out = p.stdout + p.stderr
    check(p.returncode == 1, f"deadline: the run ends by itself, failed (exit {p.returncode}, 124: the outer timeout)")
    check(took < 7, f"deadline: ended within SBN_SUITE_DEADLINE ({took:.1f} s of 7)")
    # 7 - 5 less the seconds the script took to get there (its own start: 0-1)
    check(re.search(r"env: FAILED \(stopped at its limit of [12] s\)", out) is not None,
          f"deadline: env cut to 1-2 s ({out.strip()[-300:]!r})")
    check("targets: not run (SBN_SUITE_DEADLINE=7 s reached)" in out, "deadline: targets not run")
    names = sorted(os.listdir(outdir)) if os.path.isdir(outdir) else []
    check(names == ["gpu-suite.tar.gz", "summary.txt"], f"deadline: OUTDIR packed ({names})")
    time.sleep(max(0.0, 6.5 - took))
    check(not os.path.exists(mark), "deadline: the stopped step's stand-in nvidia-smi did not go on")
    env["SBN_SUITE_DEADLINE"] = "7s"
    p = subprocess.run(["bash", suite, os.path.join(tmp, "dl2"), "env"], cwd=work, env=env,
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and not os.path.exists(os.path.join(tmp, "dl2")),
          f"deadline: SBN_SUITE_DEADLINE=7s refused, nothing written (exit {p.returncode})")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        pre = os.path.join(tmp, "prebuilt")
        os.makedirs(pre)
        shutil.copy(SCRIPT, os.path.join(pre, "gpu-suite.sh"))
        with open(os.path.join(pre, "BUILD-INFO"), "w") as f:
            f.write("commit: test\n")
        work = os.path.join(tmp, "work")  # the user's current folder
        os.makedirs(os.path.join(work, "src"))
        with open(os.path.join(work, "notes.txt"), "w") as f:
            f.write("precious\n")
        with open(os.path.join(work, "src", "main.c"), "w") as f:
            f.write("int main(void) { return 0; }\n")
        suite = os.path.join(pre, "gpu-suite.sh")
        work_before, pre_before = listing(work), listing(pre)

        refused = [
            ("an OUTDIR under a file", [suite, os.path.join(work, "notes.txt", "out"), "env"], work),
            ("an option-like OUTDIR", [suite, "--out", "env"], work),
            ("the current folder, not empty", [suite, ".", "env"], work),
            ("the prebuilt folder itself", [suite, ".", "env"], pre),
            ("an unknown step after a known one", [suite, os.path.join(work, "new"), "env", "nosuchstep"], work),
        ]
        for what, args, cwd in refused:
            rc, out = run(args, cwd)
            check(rc == 2, f"prebuilt run, {what}: exit 2 (got {rc}: {out.strip()[-200:]!r})")
            check("==> env" not in out, f"prebuilt run, {what}: no step ran")
            check(listing(work) == work_before, f"prebuilt run, {what}: the current folder unchanged")
            check(listing(pre) == pre_before, f"prebuilt run, {what}: the prebuilt folder unchanged")

        # a source tree: the script in scripts/, no BUILD-INFO
        tree = os.path.join(tmp, "tree")
        os.makedirs(os.path.join(tree, "scripts"))
        shutil.copy(SCRIPT, os.path.join(tree, "scripts", "gpu-suite.sh"))
        tree_script = os.path.join(tree, "scripts", "gpu-suite.sh")
        tree_before = listing(tree)
        rc, out = run([tree_script, "--bogus"], work)
        check(rc == 2, f"source tree, an option-like OUTDIR: exit 2 (got {rc})")
        check("==> " not in out, "source tree, an option-like OUTDIR: no step ran")
        check(listing(tree) == tree_before and listing(work) == work_before,
              "source tree, an option-like OUTDIR: nothing written")

        # prebuild into a folder that is no prebuilt folder (PYTHON=false: a prebuild that
        # went on would fail at once finding NCCL, after removing DIR)
        keep = os.path.join(tmp, "keep")
        os.makedirs(keep)
        with open(os.path.join(keep, "data.bin"), "wb") as f:
            f.write(b"\x01\x02")
        for what, d in (("a folder of other files", keep), ("'.'", ".")):
            rc, out = run([tree_script, "prebuild", d], tmp, python="false")
            check(rc == 2, f"prebuild into {what}: exit 2 (got {rc}: {out.strip()[-200:]!r})")
            check(os.path.exists(os.path.join(keep, "data.bin")), f"prebuild into {what}: kept")
        check(listing(tree) == tree_before, "prebuild refused: the source tree unchanged")
        # a prebuilt folder (BUILD-INFO), and one whose prebuild stopped (its mark), are
        # removed and built again: here the build stops at NCCL (PYTHON=false), exit 1
        for what, mark in (("an older prebuilt folder", "BUILD-INFO"),
                           ("an unfinished one", ".prebuild-unfinished")):
            old = os.path.join(tmp, "old-" + mark.strip("."))
            os.makedirs(os.path.join(old, "bin"))
            with open(os.path.join(old, mark), "w") as f:
                f.write("x\n")
            rc, out = run([tree_script, "prebuild", old], tmp, python="false")
            check(rc == 1 and "pip install" in out, f"prebuild into {what}: taken (exit {rc})")
            check(not os.path.exists(os.path.join(old, "bin")), f"prebuild into {what}: its files removed")

        # accepted: an empty OUTDIR, and a new one; the env step runs there
        empty = os.path.join(tmp, "empty")
        os.makedirs(empty)
        for what, outdir in (("an empty OUTDIR", empty), ("a new OUTDIR", os.path.join(tmp, "a", "b"))):
            rc, out = run([suite, outdir, "env"], work)
            check(rc in (0, 1) and "==> env" in out, f"prebuilt run, {what}: the env step ran (exit {rc})")
            names = sorted(os.listdir(outdir)) if os.path.isdir(outdir) else []
            check(names == ["gpu-suite.tar.gz", "summary.txt"], f"prebuilt run, {what}: OUTDIR holds {names}")
            packed = []
            if "gpu-suite.tar.gz" in names:
                with tarfile.open(os.path.join(outdir, "gpu-suite.tar.gz")) as t:
                    packed = t.getnames()
            check("env.log" in packed, f"prebuilt run, {what}: env.log in the archive ({packed})")
            check(listing(work) == work_before, f"prebuilt run, {what}: the current folder unchanged")
        deadline_case(tmp, suite, work)
    print(f"{checks.failures} failed")
    return 1 if checks.failures else 0


if __name__ == "__main__":
    sys.exit(main())
