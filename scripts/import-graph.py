#!/usr/bin/env python3
"""import-graph.py - the file-level dependency graph of the library, and its circles.

For each source file of a build's libsyncbn.a (src/*.c, src/cpu/*.c, src/gpu/*.c and, in a
CUDA build, kernels/coop.cu), nm lists the external symbols its object defines and those it
uses without defining them. A file depends on another when it uses a symbol the other
defines, declared in a shared header: a function it calls, a table it reads (sbn_nccl, a
backend's sbn_team_ops_t), or a function its own table names (gpu_team.c's tables name
gpu_launch.c's entries). A call through a table's pointer is no edge: that is how the core
and the front reach a backend. The graph must have no circle: every strongly connected
component of more than one file is reported, and the exit status is 1 if there is one.

The objects are those of the build as configured (the members of src/libsyncbn.a), so run
it after a build; a CUDA build (build/default with nvcc) and a CPU-only one (build/cpu,
build/asan) compile different files (gpu_none.c in place of the GPU backends).

Usage: import-graph.py [-v] BUILD_DIR...   (-v: every edge with the symbols behind it)
"""
import os
import re
import subprocess
import sys

EXTERNAL_DEFINED = set("TDBRCGSVWi")  # nm's letters (upper case: global; V, W: weak)


def objects(build):
    """{member name: source path} of the library's objects, and the archive's path."""
    archive = os.path.join(build, "src", "libsyncbn.a")
    objdir = os.path.join(build, "src", "CMakeFiles", "syncbn_obj.dir")
    if not os.path.isfile(archive):
        sys.exit(f"import-graph: {archive} not found (build {build} first)")
    members = subprocess.run(["ar", "t", archive], check=True, capture_output=True,
                             text=True).stdout.split()
    if len(set(members)) != len(members):
        sys.exit(f"import-graph: {archive} has two members of one name: {sorted(members)}")
    paths = {}
    for root, _, files in os.walk(objdir):
        for f in files:
            if f in members:
                rel = os.path.relpath(os.path.join(root, f), objdir)
                # src/gpu/x.c -> gpu/x.c.o; kernels/coop.cu -> __/kernels/coop.cu.o
                src = os.path.normpath(os.path.join("src", rel.replace("__", "..")))[:-2]
                if f in paths and paths[f] != src:
                    sys.exit(f"import-graph: {f} is the object of {paths[f]} and {src}")
                paths[f] = src
    missing = [m for m in members if m not in paths]
    if missing:
        sys.exit(f"import-graph: no object under {objdir} for {missing}")
    return archive, paths


def symbols(archive, paths):
    """{source: set of defined external symbols}, {source: set of undefined symbols}."""
    out = subprocess.run(["nm", "-A", "-P", archive], check=True, capture_output=True,
                         text=True).stdout
    defs = {p: set() for p in paths.values()}
    uses = {p: set() for p in paths.values()}
    for line in out.splitlines():
        # "build/src/libsyncbn.a[comm.c.o]: sbn_fail U" (POSIX format: name, type, ...)
        m = re.match(r".*\[([^]]+)\]: (\S+) (\S)", line)
        if m is None or m.group(1) not in paths:
            continue
        member, name, kind = m.groups()
        if kind in ("U", "w"):
            uses[paths[member]].add(name)
        elif kind in EXTERNAL_DEFINED:
            defs[paths[member]].add(name)
    return defs, uses


def graph(builds):
    """{file: {file it depends on: symbols}} over every build (the union of their edges)."""
    edges = {}
    for build in builds:
        archive, paths = objects(build)
        defs, uses = symbols(archive, paths)
        owner = {}
        for f, names in defs.items():
            for n in names:
                owner.setdefault(n, set()).add(f)
        for f, names in uses.items():
            out = edges.setdefault(f, {})
            for n in names:
                for g in owner.get(n, ()):
                    if g != f:
                        out.setdefault(g, set()).add(n)
    return edges


def circles(edges):
    """Strongly connected components of more than one file (Tarjan's algorithm)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                found.append(sorted(scc))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def main(argv):
    verbose = "-v" in argv
    builds = [a for a in argv if a != "-v"]
    if not builds or any(a.startswith("-") for a in builds):
        sys.exit(__doc__.rstrip())
    edges = graph(builds)
    nedges = sum(len(out) for out in edges.values())
    if verbose:
        for f in sorted(edges):
            for g in sorted(edges[f]):
                print(f"{f} -> {g}: {' '.join(sorted(edges[f][g]))}")
    found = circles(edges)
    where = ", ".join(builds)
    if not found:
        print(f"import-graph: {len(edges)} files, {nedges} edges ({where}): no circle")
        return 0
    print(f"import-graph: {len(edges)} files, {nedges} edges ({where}): "
          f"{len(found)} circle(s):", file=sys.stderr)
    for scc in found:
        print(f"  circle of {len(scc)}: {', '.join(scc)}", file=sys.stderr)
        members = set(scc)
        for f in scc:
            for g in sorted(edges[f]):
                if g in members:
                    print(f"    {f} -> {g}: {' '.join(sorted(edges[f][g]))}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
