#!/usr/bin/env python3
"""gpu_pack.py - what a GPU run carries, packed small enough to travel with the source tree.

The device tool copies the source tree and the carried paths to the GPU machine within 64 MiB
together. A prebuilt folder is ~48 MiB as files: each of its statically linked programs
holds the same kernels (~6.5 MB). An xz archive (preset 9: a 64 MiB window, wider than the
distance between two copies) keeps each copy once: ~8 MiB.

Usage: gpu_pack.py PATH [PATH ...]
       gpu_pack.py --extract ARCHIVE PARENT

Each PATH that is a folder is packed into PATH.tar.xz (replaced if it exists), with the
folder's base name at the archive's top, in name order, owners and times left out (the
same folder packs to the same bytes); a PATH ending in .tar.xz is taken as packed. Then
the archives and the source tree (the git checkout of the current folder: tracked files and
untracked ones git does not ignore, which is what the tool copies) are added up, and the
script exits 1 if they exceed 64 MiB together, 2 on a bad PATH, 0 otherwise. It prints
each archive's size, the commit its BUILD-INFO or VARIANTS.txt names (with a warning when
that is not the checkout's HEAD, clean: an archive of an older build), and how to unpack
it on the device, where no xz program is needed:

    python3 scripts/gpu_pack.py --extract build/prebuilt.tar.xz build   # -> build/prebuilt

(carry the .tar.xz, not the folder: the folder is ignored by git and stays here).

--extract unpacks ARCHIVE under PARENT (made if missing) after checking every member
(refused(): a path that is absolute, has "..", or goes through a link; a link out of
PARENT or to another link; a hard link to anything but a file before it; a member where a
link is; a device or pipe), then with tarfile's "data" filter where this Python has it
(3.12, and 3.8.17 / 3.9.17 / 3.10.12 / 3.11.4 on). Exit 0, 1 on a refused member (nothing is unpacked),
2 on bad arguments or an archive that cannot be read.
"""
import os
import re
import subprocess
import sys
import tarfile

LIMIT = 64 * 1024 * 1024  # the device tool's working tree limit, carried paths included


def _plain(info):
    """A member without its owner and time: the same folder packs to the same bytes."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def pack(folder):
    """folder -> folder.tar.xz holding basename(folder)/...; returns (the archive's path,
    the bytes of the folder's files, links counted as links)."""
    folder = folder.rstrip("/")
    out = folder + ".tar.xz"
    tmp = out + ".part"
    top = os.path.basename(folder)
    raw = 0
    with tarfile.open(tmp, "w:xz", preset=9) as tar:
        tar.add(folder, arcname=top, recursive=False, filter=_plain)
        for root, dirs, files in os.walk(folder):
            dirs.sort()  # os.walk descends in this order
            for name in dirs + sorted(files):
                path = os.path.join(root, name)
                raw += os.lstat(path).st_size if name in files else 0
                tar.add(path, arcname=os.path.join(top, os.path.relpath(path, folder)),
                        recursive=False, filter=_plain)
    os.replace(tmp, out)
    return out, raw


def built_at(archive):
    """The commit that the archive's BUILD-INFO or VARIANTS.txt names, or None."""
    with tarfile.open(archive) as tar:
        for m in tar.getmembers():
            if m.isfile() and m.name.count("/") == 1 and m.name.endswith(("/BUILD-INFO", "/VARIANTS.txt")):
                text = tar.extractfile(m).read().decode(errors="replace")
                found = re.search(r"^commit: ([^\s,]+)|^# variants of commit ([^\s,]+)", text, re.M)
                if found:
                    return found.group(1) or found.group(2)
    return None


def _walk(path, is_link):
    """path (relative, '/'-separated, as a member names it) resolved one component at a
    time: the normalized path, or None where it leaves the folder or passes through a link
    (is_link: one of the archive's, or one already on disk), which text alone cannot
    follow ("l2 -> l1/..", with l1 -> "..": inside as text, outside on disk)."""
    parts = []
    comps = [c for c in path.split("/") if c not in ("", ".")]
    for i, c in enumerate(comps):
        if c == "..":
            if not parts:
                return None
            parts.pop()
            continue
        parts.append(c)
        if i < len(comps) - 1 and is_link("/".join(parts)):
            return None
    return "/".join(parts)


def refused(members, parent):
    """The first member that could write outside parent, with why, or None. Stricter than
    the "data" filter where that has to see the disk (it checks each member as it is
    unpacked, with earlier ones written): a path with "..", or through a link; a link
    to an absolute path, out of the folder, or to another link; a hard link to anything
    but a file unpacked before it; a member where a link is (in the archive or on disk);
    anything but files, folders and links. What gpu_pack packs has none of these."""
    top = os.path.normpath(os.path.abspath(parent))
    links, files = set(), set()

    def is_link(rel):
        return rel in links or os.path.islink(os.path.join(top, rel))

    for m in members:
        if os.path.isabs(m.name) or ".." in m.name.split("/"):
            return m.name, "its path leaves the folder it is unpacked in"
        name = _walk(m.name, is_link)
        if not name:
            return m.name, "its path goes through a link or leaves the folder"
        if is_link(name):
            return m.name, "a link is there already: it would be written through"
        if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
            return m.name, "not a file, folder or link"
        if m.issym():
            target = _walk(os.path.dirname(name) + "/" + m.linkname, is_link)
            if os.path.isabs(m.linkname) or target is None or (target and is_link(target)):
                return m.name, f"a link to {m.linkname!r}, outside the folder or to another link"
            links.add(name)
        elif m.islnk():
            target = _walk(m.linkname, is_link)
            if target not in files:
                return m.name, f"a hard link to {m.linkname!r}, not a file unpacked before it"
        elif m.isfile():
            files.add(name)
    return None


def extract(archive, parent, use_filter=None):
    """Unpacks archive under parent: tarfile's "data" filter where there is one (unless
    use_filter is False: the test of the other way), else refused() first. Returns the
    exit status (main's --extract)."""
    if use_filter is None:
        use_filter = hasattr(tarfile, "data_filter")
    try:
        with tarfile.open(archive) as tar:
            os.makedirs(parent, exist_ok=True)
            members = tar.getmembers()
            bad = refused(members, parent)  # every member checked before any is written
            if bad is not None:
                print(f"gpu_pack: {archive}: refused: {bad[0]!r}: {bad[1]}; nothing was unpacked",
                      file=sys.stderr)
                return 1
            if use_filter:
                try:
                    for m in members:
                        tarfile.data_filter(m, parent)
                    tar.extractall(parent, filter="data")
                except tarfile.FilterError as e:  # (refused() saw none: as a refusal all the same)
                    print(f"gpu_pack: {archive}: refused: {e}", file=sys.stderr)
                    return 1
                return 0
            for m in members:  # the "data" filter's modes: no set-id, sticky or group/other write
                m.mode &= 0o755
            tar.extractall(parent, members)
    except (OSError, tarfile.TarError) as e:
        print(f"gpu_pack: cannot unpack {archive}: {e}", file=sys.stderr)
        return 2
    return 0


def head():
    """`git describe --always --dirty --tags` of the checkout (what the builds write), or None."""
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty", "--tags"], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


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
    if argv[0] == "--extract":
        if len(argv) != 3:
            print("gpu_pack: --extract takes ARCHIVE PARENT", file=sys.stderr)
            return 2
        return extract(argv[1], argv[2])
    archives = []
    for path in argv:
        if path.endswith(".tar.xz"):
            if not os.path.isfile(path):
                print(f"gpu_pack: no archive {path}", file=sys.stderr)
                return 2
            archives.append(path)
        elif os.path.isdir(path):
            a, raw = pack(path)
            print(f"gpu_pack: {path} ({mib(raw)}) -> {a} ({mib(os.path.getsize(a))})")
            archives.append(a)
        else:
            print(f"gpu_pack: {path} is neither a folder nor a .tar.xz", file=sys.stderr)
            return 2
    packed = sum(os.path.getsize(a) for a in archives)
    now = head()
    for a in archives:
        parent = os.path.dirname(a) or "."
        at = built_at(a)
        if at is not None:
            stale = "" if at == now else f" (WARNING: not this checkout's HEAD, {now})"
            print(f"gpu_pack: {a} was built at {at}{stale}")
        print(f"gpu_pack: on the device: python3 scripts/gpu_pack.py --extract {a} {parent}")
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
