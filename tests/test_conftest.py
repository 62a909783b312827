"""The tests' own helpers: pytest imports tests/conftest.py as ``conftest``, the test modules as
``tests.conftest``; both names must be one module, or each worker keeps two store templates and
two token caches (and prepares the data twice)."""

from __future__ import annotations


def test_the_helpers_are_one_module_under_either_name() -> None:
    from tests import conftest as by_package

    import conftest

    assert by_package is conftest
    assert by_package.session_data_dir() == conftest.session_data_dir()
