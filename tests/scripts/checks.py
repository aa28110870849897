"""The checks of tests/scripts' tests: check() prints each and counts the failed ones."""

failures = 0


def check(cond, what):
    """Prints 'ok   what' or 'FAIL what'; counts a failure."""
    global failures
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures += 1
