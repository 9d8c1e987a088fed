"""The real-process fuzzer for ``clear`` (issue 15): random forests of real processes inside a
private PID and mount namespace, attacked with random selectors, checked against the invariants
of docs/clear.md.

* :mod:`fuzzkit.forest` — a forest as data, generated from a seed (pure), and its description;
* :mod:`fuzzkit.node` — the program every process of a forest runs (fork, setsid, hold, forward...);
* :mod:`fuzzkit.driver` — runs inside the namespace: builds each forest, runs ``clear``, gathers facts;
* :mod:`fuzzkit.checks` — the invariants, as pure functions of the gathered facts.
"""
