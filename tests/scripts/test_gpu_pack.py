#!/usr/bin/env python3
"""scripts/gpu_pack.py: what a GPU run carries, packed, and the device tool's limit.

In a throwaway git checkout (a tracked file of 1 MiB, an ignored build/ folder):
- a folder with three equal copies of 2 MiB of random bytes (the prebuilt programs' shared
  kernels in miniature) packs to about one copy: xz's window keeps one;
- `gpu_pack.py --extract` (what the device runs) gives back every file, byte for byte,
  with its executable bit, and a dangling link as a link, under the folder's own name,
  with tarfile's "data" filter and with the checks made where a Python has none; both
  refuse, writing nothing, an archive with a member outside the folder (`..`, absolute),
  a link out of it, or a pipe; packing twice gives the same bytes;
- the commit its BUILD-INFO names is printed, with a warning when it is not HEAD;
- the limit counts the archives AND the source tree: a limit between the archive alone and
  the archive plus the tree fails (exit 1), one above both passes; an archive given by name
  is counted without packing again; a path that is neither is refused (exit 2).
"""
import importlib.util
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from contextlib import redirect_stdout, redirect_stderr

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "gpu_pack", os.path.join(HERE, "..", "..", "scripts", "gpu_pack.py"))
gpu_pack = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_pack)

sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import checks  # noqa: E402
from checks import check  # noqa: E402

MiB = 1024 * 1024


def run_main(args):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = gpu_pack.main(args)
    return rc, out.getvalue() + err.getvalue()


def files_of(top):
    got = {}
    for root, _, files in os.walk(top):
        for f in files:
            p = os.path.join(root, f)
            if os.path.islink(p):
                continue
            with open(p, "rb") as fh:
                got[os.path.relpath(p, top)] = (fh.read(), os.stat(p).st_mode & 0o111 != 0)
    return got


def bad_archives(ways):
    """Archives the extraction must refuse, each with its bad members after a good one:
    exit 1 and nothing written, in the folder or beside it, both ways alike (the "data"
    filter's way refused the link chains only once a member had been written)."""
    def member(name, kind=tarfile.REGTYPE, link=""):
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = link
        return info

    absolute = os.path.abspath("escaped-absolute")  # in the test's own folder: gone after it
    cases = {"dotdot": [member("top/../../escaped")], "absolute": [member(absolute)],
             "link-out": [member("top/out", tarfile.SYMTYPE, "../../..")],
             "link-absolute": [member("top/abs", tarfile.SYMTYPE, "/etc/passwd")],
             "hardlink-out": [member("top/hard", tarfile.LNKTYPE, "../outside")],
             "pipe": [member("top/fifo", tarfile.FIFOTYPE)],
             # inside as text, outside on disk: l2 -> l1/.. with l1 -> .. (the parent)
             "link-chain": [member("top/l1", tarfile.SYMTYPE, ".."), member("top/l2", tarfile.SYMTYPE, "l1/.."),
                            member("top/l2/evil.txt")],
             "hardlink-through-link": [member("top/l1", tarfile.SYMTYPE, ".."),
                                       member("top/h", tarfile.LNKTYPE, "top/l1/../secret.txt"), member("top/h")],
             "file-over-link": [member("top/l1", tarfile.SYMTYPE, ".."), member("top/l1")]}
    folders = {"in"} | {how.replace(" ", "-") for how, _ in ways}  # what the test makes itself
    for name, bads in cases.items():
        path = os.path.join("build", f"bad-{name}.tar")
        with tarfile.open(path, "w") as tar:
            good = tarfile.TarInfo("top/good.txt")
            good.size = 3
            tar.addfile(good, io.BytesIO(b"abc"))
            for bad in bads:
                tar.addfile(bad, io.BytesIO(b"") if bad.isfile() else None)
        for how, use_filter in ways:
            parent = os.path.join("build", "bad", name, how.replace(" ", "-"), "in")
            os.makedirs(parent)
            if use_filter is None:
                r = subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "scripts", "gpu_pack.py"),
                                    "--extract", path, parent], capture_output=True, text=True)
                rc, err = r.returncode, r.stderr
            else:
                err = io.StringIO()
                with redirect_stderr(err):
                    rc = gpu_pack.extract(path, parent, use_filter=use_filter)
                err = err.getvalue()
            outside = os.path.dirname(os.path.dirname(parent))  # build/bad/NAME: the ways' folders
            written = [os.path.join(root, f) for root, dirs, files in os.walk(outside)
                       for f in dirs + files if f not in folders]
            check(rc == 1 and "refused" in err and not written and not os.path.lexists(absolute),
                  f"{how}: an archive with a {name} member is refused, nothing written (exit {rc}, {written})")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        subprocess.run(["git", "init", "-q", "."], check=True)
        with open(".gitignore", "w") as f:
            f.write("build/\n")
        with open("tracked.bin", "wb") as f:
            f.write(os.urandom(MiB))
        subprocess.run(["git", "add", ".gitignore", "tracked.bin"], check=True)
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "t"],
                       check=True)
        at = subprocess.run(["git", "describe", "--always", "--dirty", "--tags"], check=True,
                            capture_output=True, text=True).stdout.strip()
        tree = gpu_pack.tree_bytes()
        check(tree is not None and MiB <= tree < MiB + 100,
              f"the source tree counts the tracked file and .gitignore ({tree} bytes)")

        pre = os.path.join("build", "pre")
        os.makedirs(os.path.join(pre, "bin"))
        os.makedirs(os.path.join(pre, "python", "pkg"))
        blob = os.urandom(2 * MiB)
        for name in ("a", "b", "c"):
            p = os.path.join(pre, "bin", name)
            with open(p, "wb") as f:
                f.write(blob)
            os.chmod(p, 0o755)
        with open(os.path.join(pre, "python", "pkg", "mod.py"), "w") as f:
            f.write("x = 1\n")
        with open(os.path.join(pre, "BUILD-INFO"), "w") as f:
            f.write(f"syncbn prebuilt folder\ncommit: {at}\n")
        os.symlink("no-such-file", os.path.join(pre, "python", "dangling"))

        rc, text = run_main([pre])
        archive = pre + ".tar.xz"
        check(rc == 0 and os.path.isfile(archive), f"packed, exit {rc}")
        check(f"built at {at}\n" in text, f"it names the commit of its BUILD-INFO, HEAD ({at}), with no warning")
        size = os.path.getsize(archive)
        check(size < 2.2 * MiB,
              f"three equal copies of 2 MiB pack to about one ({size} bytes)")
        check(f"python3 scripts/gpu_pack.py --extract {archive} build" in text, "it prints the device's command")

        # the device's command (a new process, as there), then the checks made by hand
        ways = [("--extract", None)] + ([("data filter", True)] if hasattr(tarfile, "data_filter") else []) \
            + [("by hand", False)]
        for how, use_filter in ways:
            out = os.path.join("build", "unpacked-" + how.replace(" ", "-"))  # ignored: not part of the tree
            if use_filter is None:
                rc = subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "scripts", "gpu_pack.py"),
                                     "--extract", archive, out]).returncode
            else:
                rc = gpu_pack.extract(archive, out, use_filter=use_filter)
            want, got = files_of(pre), files_of(os.path.join(out, "pre"))
            check(rc == 0 and got == want and len(want) == 5,
                  f"{how}: gives back every file, its bytes and executable bit, under pre/ (exit {rc})")
            link = os.path.join(out, "pre", "python", "dangling")
            check(os.path.islink(link) and os.readlink(link) == "no-such-file",
                  f"{how}: and the dangling link as a link")
        bad_archives(ways)

        with open(archive, "rb") as f:
            first = f.read()
        for root, _, files in os.walk(pre):  # newer times: not in the archive
            for name in files:
                os.utime(os.path.join(root, name), (1e9, 1e9), follow_symlinks=False)
        run_main([pre])
        with open(archive, "rb") as f:
            check(f.read() == first, "packing the same folder again (its files touched) gives the same bytes")
        with open(os.path.join(pre, "BUILD-INFO"), "w") as f:
            f.write("commit: 0123abc-dirty\n")
        rc, text = run_main([pre])
        check(rc == 0 and "built at 0123abc-dirty (WARNING: not this checkout's HEAD" in text,
              "an archive of another commit is named so")
        # a folder of variants (scripts/gpu-variants.sh's VARIANTS.txt header) of HEAD
        var = os.path.join("build", "var")
        os.makedirs(var)
        with open(os.path.join(var, "VARIANTS.txt"), "w") as f:
            f.write(f"# variants of commit {at}, built 2026-11-30T08:10:08Z\nbase\t\t{at}\tspills: 0\n")
        rc, text = run_main([var])
        check(rc == 0 and f"built at {at}\n" in text, f"a folder of variants names its commit, HEAD ({at})")

        # the archive as it is now: packed again above with another BUILD-INFO, its size
        # may differ from the first one's by a few bytes
        size = os.path.getsize(archive)
        saved = gpu_pack.LIMIT
        try:
            gpu_pack.LIMIT = size + tree // 2
            rc, text = run_main([archive])
            check(rc == 1 and "FAILED" in text,
                  f"a limit above the archive but below archive + tree fails (exit {rc})")
            gpu_pack.LIMIT = size + tree
            rc, _ = run_main([archive])
            check(rc == 0, f"a limit of archive + tree exactly passes (exit {rc})")
        finally:
            gpu_pack.LIMIT = saved
        rc, _ = run_main(["tracked.bin"])
        check(rc == 2, f"a file that is not an archive is refused (exit {rc})")
        rc, _ = run_main(["build/missing.tar.xz"])
        check(rc == 2, f"a missing archive is refused (exit {rc})")
    print(f"test_gpu_pack: {checks.failures} failure(s)")
    return 1 if checks.failures else 0


if __name__ == "__main__":
    sys.exit(main())
