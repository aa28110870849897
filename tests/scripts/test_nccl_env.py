#!/usr/bin/env python3
"""cmake/nccl_env.py: where a pip build looks for the installing environment's NCCL.

Run with the script to test as the first argument (a mutant's path, or by default the
project's) and CMake as the second (for the find_path check; 'none' skips that check).
With VIRTUAL_ENV and CONDA_PREFIX set to two throwaway folders:
- the list names each one's site-packages/nvidia/nccl (by sysconfig, as pip and
  PyTorch's nvidia-nccl wheel lay them out) and each folder itself (a conda prefix's
  include/), after the interpreter's own site-packages (the environment pip installs into
  comes first) and VIRTUAL_ENV's before CONDA_PREFIX's;
- CMake's find_path, given the list as HINTS and nothing else, finds a nccl.h placed in
  VIRTUAL_ENV's nvidia/nccl/include (the list is a CMake list of prefixes);
- with neither variable set, neither folder is named.
"""
import os
import subprocess
import sys
import sysconfig
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
script = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "cmake", "nccl_env.py")
cmake = sys.argv[2] if len(sys.argv) > 2 else "cmake"
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import checks  # noqa: E402
from checks import check  # noqa: E402


def candidates(extra_env):
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    env.update(extra_env)
    out = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    return out.split(";")


def wheel_dir(base):
    return sysconfig.get_paths(vars={"base": base, "platbase": base})["purelib"] + "/nvidia/nccl"


with tempfile.TemporaryDirectory() as tmp:
    venv, conda = os.path.join(tmp, "venv"), os.path.join(tmp, "conda")
    got = candidates({"VIRTUAL_ENV": venv, "CONDA_PREFIX": conda})
    print("candidates:\n  " + "\n  ".join(got))
    own = wheel_dir(sys.prefix)
    for name, base in (("VIRTUAL_ENV", venv), ("CONDA_PREFIX", conda)):
        check(wheel_dir(base) in got, f"{name}'s site-packages/nvidia/nccl is named")
        check(base in got, f"{name} itself is named (a conda prefix's include/, lib/)")
    check(own in got, f"the interpreter's own {own} is named")
    if own in got and wheel_dir(venv) in got:
        check(got.index(own) < got.index(wheel_dir(venv)),
              "the interpreter's own site-packages come before VIRTUAL_ENV's")
    if wheel_dir(venv) in got and wheel_dir(conda) in got:
        check(got.index(wheel_dir(venv)) < got.index(wheel_dir(conda)),
              "VIRTUAL_ENV's come before CONDA_PREFIX's")

    if cmake != "none":
        inc = os.path.join(wheel_dir(venv), "include")
        os.makedirs(inc)
        open(os.path.join(inc, "nccl.h"), "w").close()
        probe = os.path.join(tmp, "probe.cmake")
        with open(probe, "w") as f:
            f.write('find_path(found nccl.h HINTS ${hints} PATH_SUFFIXES include '
                    'NO_DEFAULT_PATH)\nmessage("found=${found}")\n')
        r = subprocess.run([cmake, "-Dhints=" + ";".join(got), "-P", probe],
                           capture_output=True, text=True)
        print(r.stdout + r.stderr, end="")
        check(r.returncode == 0 and f"found={inc}" in r.stdout + r.stderr,
              "CMake's find_path with the list as HINTS finds VIRTUAL_ENV's nccl.h")

    bare = candidates({})
    check(not any(p.startswith(tmp) for p in bare),
          "without VIRTUAL_ENV and CONDA_PREFIX neither folder is named")

print("PASSED" if checks.failures == 0 else f"FAILED: {checks.failures} check(s)")
sys.exit(1 if checks.failures else 0)
