"""Helpers of the Python tests that run CPU teams (their ranks are threads): imported from
the tests' own folder (a test run as a script has it on sys.path)."""

import threading
import unittest

import syncbn


def run_ranks(n, fn):
    """fn(r) for r < n, each on a thread of its own; the exception of each rank, or None."""
    errs = [None] * n

    def body(r):
        try:
            fn(r)
        except Exception as e:  # noqa: BLE001 (reported per rank)
            errs[r] = e

    ts = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return errs


def destroy_result(comm):
    """comm.destroy()'s outcome: "destroyed", or the name of the SyncBNError it raised (the
    tests of a destroy from another thread while a call has the comm)."""
    try:
        comm.destroy()
    except syncbn.SyncBNError as e:
        return e.name
    return "destroyed"


class TeamOfOne(unittest.TestCase):
    """A CPU team of one rank for the class's tests (self.comm)."""

    @classmethod
    def setUpClass(cls):
        cls.comm = syncbn.cpu_team(1)[0]

    @classmethod
    def tearDownClass(cls):
        cls.comm.destroy()
