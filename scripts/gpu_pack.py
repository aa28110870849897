#!/usr/bin/env python3
"""gpu_pack.py - what a GPU run carries, packed small enough to travel with the source tree.

The device tool copies the source tree and the carried paths to the GPU machine within 64 MiB
together. A prebuilt folder is ~49 MiB as files: each of its statically linked programs
holds the same kernels (~6.5 MB). An xz archive (preset 9: a 64 MiB window, wider than the
distance between two copies) keeps each copy once: ~9 MiB.

Usage: gpu_pack.py PATH [PATH ...]

Each PATH that is a folder is packed into PATH.tar.xz (replaced if it exists), with the
folder's base name at the archive's top; a PATH ending in .tar.xz is taken as packed. Then
the archives and the source tree (the git checkout of the current folder: tracked files and
untracked ones git does not ignore, which is what the tool copies) are added up, and the
script exits 1 if they exceed 64 MiB together, 0 otherwise. It prints each archive's size
and how to unpack it on the device, where no xz program is needed:

    python3 -m tarfile -e build/prebuilt.tar.xz build     # -> build/prebuilt

(carry the .tar.xz, not the folder: the folder is ignored by git and stays here).
"""
import os
import subprocess
import sys
import tarfile

LIMIT = 64 * 1024 * 1024  # the device tool's working tree limit, carried paths included


def pack(folder):
    """folder -> folder.tar.xz holding basename(folder)/...; returns the archive's path."""
    folder = folder.rstrip("/")
    out = folder + ".tar.xz"
    tmp = out + ".part"
    with tarfile.open(tmp, "w:xz", preset=9) as tar:
        # sorted, so that the same folder packs to the same bytes
        tar.add(folder, arcname=os.path.basename(folder), recursive=False)
        for root, dirs, files in os.walk(folder):
            dirs.sort()
            for name in sorted(dirs) + sorted(files):
                path = os.path.join(root, name)
                tar.add(path, arcname=os.path.join(os.path.basename(folder),
                                                   os.path.relpath(path, folder)),
                        recursive=False)
    os.replace(tmp, out)
    return out


def tree_bytes():
    """Bytes of what the device tool copies of the checkout: None outside a git checkout."""
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True,
                             capture_output=True, text=True).stdout.strip()
        names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                "--exclude-standard"], check=True, capture_output=True,
                               cwd=top).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        return None
    total = 0
    for n in names:
        p = os.path.join(top.encode(), n)
        if n and os.path.isfile(p) and not os.path.islink(p):  # deleted files are listed
            total += os.path.getsize(p)
    return total


def mib(n):
    return f"{n / 1024 / 1024:.1f} MiB"


def main(argv):
    if not argv or any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        return 0 if argv else 2
    archives = []
    for path in argv:
        if path.endswith(".tar.xz"):
            if not os.path.isfile(path):
                print(f"gpu_pack: no archive {path}", file=sys.stderr)
                return 2
            archives.append(path)
        elif os.path.isdir(path):
            raw = sum(os.path.getsize(os.path.join(r, f))
                      for r, _, fs in os.walk(path) for f in fs)
            a = pack(path)
            print(f"gpu_pack: {path} ({mib(raw)}) -> {a} ({mib(os.path.getsize(a))})")
            archives.append(a)
        else:
            print(f"gpu_pack: {path} is neither a folder nor a .tar.xz", file=sys.stderr)
            return 2
    packed = sum(os.path.getsize(a) for a in archives)
    for a in archives:
        parent = os.path.dirname(a) or "."
        print(f"gpu_pack: on the device: python3 -m tarfile -e {a} {parent}")
    tree = tree_bytes()
    if tree is None:
        print(f"gpu_pack: not in a git checkout: the archives alone are {mib(packed)} of 64")
        total = packed
    else:
        total = packed + tree
        print(f"gpu_pack: the archives ({mib(packed)}) and the source tree ({mib(tree)}): "
              f"{mib(total)} of 64")
    if total > LIMIT:
        print("gpu_pack: FAILED: larger than the device tool's 64 MiB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
