"""What the tests, `make demo` and `make bench` build on: synthetic checkpoints real in form
(`synthetic`)."""
