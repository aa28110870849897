#!/usr/bin/env python3
"""check_supp.py - the compute-sanitizer suppressions file suppresses NCCL's own errors only.

scripts/compute-sanitizer-supp.xml lets memcheck pass over the API errors NCCL makes on
purpose while it looks for kernel images (first GPU run: 144 errors, exit 99), and the ones
of NCCL's symmetric-memory allocation that only memcheck provokes (its cuMemCreate refused
with 800, then NCCL's cleanup unmapping what it never mapped: the H200 run at 1599faa). A
record that matched more (any API, any result, any stack) would hide real errors, so every
record must name: kind Api, one of the APIs of ALLOWED with its result, and a host stack
whose last listed frame is ALLOWED's NCCL function of that API in libnccl.so.2, with only
libcuda/libnccl frames before it (compute-sanitizer matches frames by position from the
driver's entry point; see the file's comments). The GPU run checks that it works
(scripts/gpu-suite.sh: a control error outside NCCL must still fail memcheck).

Usage: check_supp.py FILE   (exit 0: narrow; 1: a record is too wide, said why)
"""
import re
import sys
import xml.etree.ElementTree as ET

# api -> (its result, the NCCL function that makes the call)
ALLOWED = {
    "cudaFuncGetAttributes": ("209", "ncclInitKernelsForDevice"),  # kernel-image probes
    "cudaGetLastError": ("209", "ncclInitKernelsForDevice"),
    "cuMemCreate": ("800", "ncclMemAlloc"),  # refused under memcheck only
    "cuMemUnmap": ("1", "ncclDevrFinalize"),  # NCCL's cleanup after that refusal
    "cuMemAddressFree": ("1", "ncclDevrFinalize"),
}


def whole(pattern, text):
    return re.fullmatch(pattern, text) is not None


def check(path):
    root = ET.parse(path).getroot()
    if root.tag != "ComputeSanitizerOutput":
        return [f"root element is {root.tag}, not ComputeSanitizerOutput"]
    records = root.findall("record")
    if not records:
        return ["no <record>"]
    errors = []
    for i, rec in enumerate(records):
        where = f"record {i}"
        if rec.findtext("kind") != "Api":
            errors.append(f"{where}: kind {rec.findtext('kind')!r}, not Api")
        api = rec.findtext("what/api") or ""
        if api not in ALLOWED:
            errors.append(f"{where}: api {api!r} is not one of {sorted(ALLOWED)}")
            continue
        result, nccl_func = ALLOWED[api]
        if (rec.findtext("what/result") or "").strip() != result:
            errors.append(f"{where}: result must be {result} (no result = any error)")
        frames = rec.findall("hostStack/frame")
        if not frames:
            errors.append(f"{where}: no host stack (would match the API from anywhere)")
            continue
        last = frames[-1]
        func = last.findtext("func") or ""
        module = last.findtext("module") or ""
        if not whole(func, nccl_func) or whole(func, "ncclOtherFunction"):
            errors.append(f"{where}: last frame's func {func!r} is not {nccl_func} only")
        if not whole(module, "libnccl.so.2") or whole(module, "libcudart.so.13") or "/" in module or "\\" in module:
            errors.append(f"{where}: last frame's module {module!r} is not libnccl.so.2 only")
        for j, fr in enumerate(frames[:-1]):
            mod = fr.findtext("module") or ""
            if not mod or whole(mod, "libsyncbn.so.0") or whole(mod, "libsyncbn.so.0.1") or whole(mod, "test_gpu_team") or not whole(mod, "libcuda.so.1"):
                errors.append(f"{where}: frame {j} module {mod!r} must be libcuda/libnccl only")
    return errors


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    errors = check(sys.argv[1])
    for e in errors:
        print(f"check_supp: {sys.argv[1]}: {e}")
    if errors:
        sys.exit(1)
    print(f"check_supp: {sys.argv[1]}: every record is one of NCCL's own errors only")


if __name__ == "__main__":
    main()
