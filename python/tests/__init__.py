"""Tests of the uringtier Python package; run from the repository root with

    make test-python

or, as CI does, through the Go test capi/python_test.go (go test ./capi/), which builds the library
and fails on any skipped test when CI is set.
"""
